"""What the caller heard, decided on the log (pure): the transcript of a turn as messages, the
bot's turn cut to the part of its audio that played, and which of the caller's words are the
late transcription of the turn the bot already answered.

Gemini Live transcribes everything the model generated, and its audio reaches the caller
later than it reaches the worker. When the caller barges in, the unplayed rest of the turn
was never said as far as the caller knows: the log records the turn cut to the part heard
(`conversation.message_cut`), or a session seeded from the log after a takeover would hold
words the caller never heard. The shell measures (the playback position, when words
arrived); these functions decide, so a worker that takes over and `replay` decide alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import events as ev
from .state import SessionState

#: Appended to a turn cut short: the model reading its seeded history sees it was cut off.
CUT_MARK = " —"

#: How long after the bot's message the user's words may still be the late transcription of
#: the turn it answered (3.x), if the model says nothing new meanwhile.
LATE_WORDS_S = 3.0


def heard_text(text: str, fraction: float | None) -> str:
    """`text` (a whole turn's transcript) cut to the words spoken in the first `fraction` of
    its audio, assuming an even pace (Gemini gives no word timings). Unchanged when the
    fraction is unknown or the whole turn played; empty when nothing did."""
    if fraction is None or fraction >= 1.0 or not text.strip():
        return text
    words = text.split()
    kept = round(len(words) * max(0.0, fraction))
    if kept == len(words):
        return text
    return " ".join(words[:kept]) + CUT_MARK if kept else ""


def cut_of(text: str, generation: int, fraction: float | None) -> list[ev.Event]:
    """The cut of a bot message the caller heard `fraction` of: none if they heard it all
    (or the fraction is unknown); the cut mark alone if they heard nothing."""
    cut = heard_text(text, fraction)
    return [] if cut == text else [ev.ConversationMessageCut(cut or CUT_MARK.strip(),
                                                             generation)]


def is_late(state: SessionState, since_answer_s: float | None) -> bool:
    """Are words that arrived `since_answer_s` after the bot's last message (None: no message
    stands they could belong to) the late transcription of the turn it answered? Only on
    models that transcribe the caller after answering (3.x), and only within LATE_WORDS_S."""
    return (state.rules.late_input_transcription and since_answer_s is not None
            and since_answer_s < LATE_WORDS_S)


def transcript_events(state: SessionState, generation: int,
                      words: Sequence[tuple[str, float | None]], said: str,
                      heard_fraction: float | None, said_audio_s: float | None = None,
                      said_audio_from_us: int | None = None) -> list[ev.Event]:
    """What was said since the last flush, as one message per role: the late words of the
    turn already answered first (the fold places them with it), then this turn's; the bot's
    `said` as said (with its audio's length), then cut to the `heard_fraction` of its audio
    (an interrupted turn)."""
    late = "".join(text for text, since in words if is_late(state, since)).strip()
    user = "".join(text for text, since in words if not is_late(state, since)).strip()
    said = said.strip()
    out: list[ev.Event] = []
    if late:
        out.append(ev.ConversationMessage("user", late, generation, late=True))
    if user:
        out.append(ev.ConversationMessage("user", user, generation))
    if said:
        audio_s = round(said_audio_s, 3) if said_audio_s else None
        out += [ev.ConversationMessage("assistant", said, generation, audio_s=audio_s,
                                       audio_from_us=said_audio_from_us if audio_s else None),
                *cut_of(said, generation, heard_fraction)]
    return out


def interruption_events(state: SessionState, generation: int, local: bool,
                        model_turn: bool, finished_turn_heard: float | None
                        ) -> list[ev.Event]:
    """The caller talked over the bot. Gemini's `interrupted` (a model turn under way) is
    logged as such; the bot's last message, logged whole when the model finished its turn,
    is cut to what the caller heard of it if its audio was still playing
    (`finished_turn_heard` < 1). A local barge-in (the pipeline's voice detector) with a
    model turn under way is Gemini's to decide; after the turn it counts only if it cut
    the finished turn's audio."""
    if local and model_turn:
        return []
    said = state.uncut_answer
    cut = cut_of(said[0], said[1], finished_turn_heard) if said is not None else []
    if local and not cut:
        return []
    return [ev.Interrupted(generation), *cut]


def takeover_events(state: SessionState, now_us: int | None, lead_s: float = 0.0,
                    handed_over_us: int | None = None) -> list[ev.Event]:
    """A worker took the call over at `now_us`: the dead worker stopped writing the bot's
    last message somewhere before then, and what it had written (`lead_s` ahead of real
    time) played out. If that time since its first audio arrived is shorter than
    its audio, the caller cannot have heard all of it: it is cut to the part
    that time allows, as a barge-in would cut it, so the next session is seeded with what
    the caller heard instead of resuming a model that said the rest (lineage.holds_cut_turn).
    `handed_over_us`, when the transport knows it, is when the call was handed to this
    worker: the dead worker's stream had ended by then, which bounds its playback closer
    than the takeover does (a busy worker attaches some 0.2-0.5 s after the hand-over).
    Death came before either, so this errs towards heard: the caller may miss the end
    of a message rather than hear a step twice."""
    playing = state.playing
    if playing is None or now_us is None or playing.audio_s <= 0:
        return []
    ended_us = now_us if handed_over_us is None else min(now_us, handed_over_us)
    fraction = ((ended_us - playing.started_us) / 1e6 + lead_s) / playing.audio_s
    return cut_of(playing.text, playing.generation, fraction) if fraction < 1.0 else []

