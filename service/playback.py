"""What the caller heard of an interrupted bot turn.

Gemini Live transcribes everything the model generated, and its audio reaches the caller
later than it reaches the worker (the transport plays it in real time, the telephony
provider buffers more). When the caller barges in, the unplayed rest of the turn was never
said as far as the caller knows: the log must not record it as said, or a session seeded
from the log after a takeover would hold words the caller never heard (issue #32, item 6).

A pipeline that knows its playback position (the phone bot: Twilio `mark`s echoed once the
audio before them played, examples/phone_bot/playback.py) sets the service's `playback` to
an object with `heard_fraction()`: the part of the current turn's audio played so far, or
None when unknown, and `finished_turn_heard()`: the same for the model's last finished turn
while it is still playing. On an interruption the service logs the bot's turn cut to that
part: a turn under way (Gemini's `interrupted`) is logged cut; one the model had finished, and
logged whole, gets its message cut after it (`conversation.message_cut`).
"""

from __future__ import annotations

from typing import Protocol

#: Appended to a turn cut short: the model reading its seeded history sees it was cut off.
CUT_MARK = " —"


class PlaybackPosition(Protocol):
    def heard_fraction(self) -> float | None:
        """Of the audio of the bot's current turn, the part the caller heard (0..1)."""

    def finished_turn_heard(self) -> float | None:
        """Of the audio of the model's last finished turn, the part the caller heard, while
        they are still hearing it; None once it played in full (or no turn finished)."""


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
