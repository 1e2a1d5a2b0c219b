"""What the caller heard, decided on the log (session_store/heard.py): an interrupted turn cut
to the part of its audio that played, a local barge-in after a finished turn, and which of
the caller's words are the late transcription of the turn already answered (3.x)."""

from __future__ import annotations

import json

from session_store import events as ev
from session_store.decide import InterruptionObserved, TakenOver, TranscriptFlushed, decide
from session_store.delivery import choose_resumption
from session_store.events import canonical_json
from session_store.heard import CUT_MARK, LATE_WORDS_S, heard_text
from session_store.observed import observation_of, observation_record
from session_store.policy import Policy
from session_store.projection import from_snapshot, to_snapshot

from .helpers import Log

TEXT = "one two three four five six seven eight nine ten"
G25 = "models/gemini-2.5-flash-native-audio-preview"
G38 = "models/gemini-3.8-live"


def connected(model: str = G38) -> Log:
    log = Log()
    log.add(ev.SessionOpened(model, [], "w1", 1), ev.Connected(1))
    return log


def decided(log: Log, obs) -> list[ev.Event]:
    return decide(log.state(), obs, Policy())


# ----------------------------------------------------------------- the cut of a turn

def test_the_heard_part_is_the_words_of_that_part_of_the_audio():
    assert heard_text(TEXT, 0.3) == "one two three" + CUT_MARK
    assert heard_text(TEXT, 0.34) == "one two three" + CUT_MARK
    assert heard_text(TEXT, 0.36) == "one two three four" + CUT_MARK


def test_a_turn_heard_in_full_or_of_unknown_playback_is_kept_whole():
    for fraction in (None, 1.0, 1.5, 0.99):
        assert heard_text(TEXT, fraction) == TEXT


def test_a_turn_cut_before_its_first_word_is_empty():
    assert heard_text(TEXT, 0.0) == ""
    assert heard_text(TEXT, -0.2) == ""
    assert heard_text("   ", 0.5) == "   "


def test_an_interrupted_turn_is_logged_as_said_then_cut_to_the_part_heard():
    log = connected()
    said = ev.ConversationMessage("assistant", TEXT, 1)
    for fraction, cut in ((0.0, [ev.ConversationMessageCut(CUT_MARK.strip(), 1)]),
                          (0.5, [ev.ConversationMessageCut("one two three four five"
                                                           + CUT_MARK, 1)]),
                          (1.0, []), (None, [])):
        obs = TranscriptFlushed(1, (("Stop", None),), f" {TEXT} ", fraction)
        assert decided(log, obs) == [ev.ConversationMessage("user", "Stop", 1), said, *cut]


def test_the_fold_remembers_the_last_whole_answer_until_an_interruption_or_its_cut():
    log = connected()
    log.add(ev.ConversationMessage("assistant", "first", 1),
            ev.ConversationMessage("user", "and?", 1),
            ev.ConversationMessage("assistant", TEXT, 1))
    state = log.state()
    assert state.uncut_answer == (TEXT, 1)
    assert from_snapshot(to_snapshot(state)).uncut_answer == (TEXT, 1)
    log.add(ev.Interrupted(1))
    assert log.state().uncut_answer is None
    log.add(ev.ConversationMessage("assistant", "again", 1), ev.ConversationMessageCut("—", 1))
    assert log.state().uncut_answer is None
    log.add(ev.ConversationMessage("assistant", "later", 1), ev.WorkerAttached("w2", 2))
    assert log.state().uncut_answer is None  # nothing of it plays on the new worker


# ----------------------------------------------------------------- interruptions

def finished() -> Log:
    log = connected()
    log.add(ev.ConversationMessage("assistant", TEXT, 1), ev.BotStartedSpeaking(1))
    return log


def test_gemini_interrupting_a_new_turn_cuts_the_finished_one_still_playing():
    log = finished()
    assert decided(log, InterruptionObserved(1, finished_turn_heard=0.3)) == [
        ev.Interrupted(1), ev.ConversationMessageCut("one two three" + CUT_MARK, 1)]
    # It played in full (or no playback is known): only the interruption.
    for heard in (None, 1.0):
        assert decided(log, InterruptionObserved(1, finished_turn_heard=heard)) == [
            ev.Interrupted(1)]


def test_a_local_barge_in_after_a_finished_turn_cuts_its_message():
    log = finished()
    events = decided(log, InterruptionObserved(1, local=True, finished_turn_heard=0.5))
    assert events == [ev.Interrupted(1),
                      ev.ConversationMessageCut("one two three four five" + CUT_MARK, 1)]
    assert decided(log, InterruptionObserved(1, local=True, finished_turn_heard=0.0)) == [
        ev.Interrupted(1), ev.ConversationMessageCut(CUT_MARK.strip(), 1)]
    log.add(*events)
    state = log.state()
    assert state.conversation[-1] == ("assistant", "one two three four five" + CUT_MARK)
    assert not state.bot_speaking and state.uncut_answer is None
    # Consulted once: a second barge-in over the same audio cuts nothing again.
    assert decided(log, InterruptionObserved(1, local=True, finished_turn_heard=0.6)) == []


def test_a_local_barge_in_that_cuts_nothing_is_not_an_interruption():
    log = finished()
    # A model turn under way: Gemini decides (its `interrupted`).
    assert decided(log, InterruptionObserved(1, local=True, model_turn=True,
                                             finished_turn_heard=0.5)) == []
    # Heard in full, or no message logged whole to cut.
    assert decided(log, InterruptionObserved(1, local=True, finished_turn_heard=1.0)) == []
    assert decided(connected(), InterruptionObserved(1, local=True,
                                                     finished_turn_heard=0.5)) == []


# ----------------------------------------------------------------- late words

def test_late_words_inside_the_window_go_with_the_turn_answered_on_3x():
    log = connected(G38)
    obs = TranscriptFlushed(1, ((" the code", 0.4), (" word?", 2.9), (" Thanks", 3.0),
                                (" bye", None)))
    assert decided(log, obs) == [
        ev.ConversationMessage("user", "the code word?", 1, late=True),
        ev.ConversationMessage("user", "Thanks bye", 1)]


def test_words_outside_the_window_or_with_no_answer_standing_are_a_turn_of_their_own():
    log = connected(G38)
    for since in (LATE_WORDS_S, 7.5, None):
        assert decided(log, TranscriptFlushed(1, (("Hello", since),))) == [
            ev.ConversationMessage("user", "Hello", 1)]


def test_on_2_5_late_words_do_not_apply():
    log = connected(G25)
    assert decided(log, TranscriptFlushed(1, ((" the code word?", 0.2),), "Swordfish.")) == [
        ev.ConversationMessage("user", "the code word?", 1),
        ev.ConversationMessage("assistant", "Swordfish.", 1)]


def test_nothing_said_decides_nothing():
    assert decided(connected(), TranscriptFlushed(1, (("  ", 0.1),), " ", 0.5)) == []


# ----------------------------------------------------------------- logged and read back

def test_the_observations_read_back_to_the_same_decisions_and_the_answer_is_kept_once():
    log = finished()
    state = log.state()
    for obs in (TranscriptFlushed(1, (("the code", 0.5), (" word?", None)), TEXT, 0.25),
                TranscriptFlushed(1, said="Sure."),
                InterruptionObserved(1, local=True, finished_turn_heard=0.5),
                InterruptionObserved(1, finished_turn_heard=0.2)):
        events = decide(state, obs, Policy())
        record = observation_record(obs, events, state)
        text = canonical_json(record.to_data())
        back = ev.decode(record.TYPE, record.SCHEMA, json.loads(text))
        assert isinstance(back, ev.ObservationRecorded)
        rebuilt, _ = observation_of(back, events)
        assert rebuilt == obs
        assert decide(state, rebuilt, Policy()) == events
        if isinstance(obs, TranscriptFlushed):
            assert text.count(obs.said) == 0 and back.refs["said"][1] == "text"


# ----------------------------------------------------------------- a takeover mid-message

def greeting_playing(audio_s: float = 2.0) -> tuple[Log, int]:
    """A call whose first worker logged the bot's 2 s greeting a moment after its first audio
    arrived (the model sends audio faster than it plays), then died; the next one attached.
    Also when the greeting's first audio arrived."""
    log = connected()
    started = log.now_us + 5_000
    log.add(ev.BotStartedSpeaking(1, "model"), at_us=started + 300_000)  # (a lazy note)
    log.add(ev.ConversationMessage("assistant", TEXT, 1, audio_s=audio_s,
                                   audio_from_us=started),
            ev.HandleIssued(1, "h1"))
    log.add(ev.WorkerAttached("w2", 2, "takeover"))
    return log, started


def takeover_at(log: Log, at_us: int) -> list[ev.Event]:
    return decide(log.state(), TakenOver(), Policy(), at_us)


def test_a_takeover_cuts_the_message_whose_audio_cannot_have_played_yet():
    log, started = greeting_playing()
    assert takeover_at(log, started + 500_000) == [
        ev.ConversationMessageCut(heard_text(TEXT, 0.25), 1)]
    assert heard_text(TEXT, 0.25).endswith(CUT_MARK)
    assert takeover_at(log, started + 50_000) == [ev.ConversationMessageCut(CUT_MARK.strip(), 1)]
    # Time enough for all of it to play: the caller may have heard it all; it stands.
    assert takeover_at(log, started + 2_000_000) == []
    assert takeover_at(log, started + 30_000_000) == []
    # What the dead worker had written ahead of the caller's ear played on after it died.
    late = started + 1_800_000
    assert takeover_at(log, late) == [ev.ConversationMessageCut(heard_text(TEXT, 0.9), 1)]
    assert decide(log.state(), TakenOver(playback_lead_s=0.3), Policy(), late) == []


def test_the_hand_over_bounds_the_dead_workers_playback_closer_than_the_takeover():
    # Handed over 0.5 s into the message, attached 1.9 s in (a busy worker): the dead
    # worker's stream had ended by the hand-over, so the caller heard a quarter of it.
    log, started = greeting_playing()
    handed = TakenOver(handed_over_us=started + 500_000)
    assert decide(log.state(), handed, Policy(), started + 1_900_000) == [
        ev.ConversationMessageCut(heard_text(TEXT, 0.25), 1)]
    # The earlier of the two counts: a hand-over stamped after the takeover (another
    # host's clock) does not stretch what was heard.
    late_stamp = TakenOver(handed_over_us=started + 3_000_000)
    assert decide(log.state(), late_stamp, Policy(), started + 500_000) == [
        ev.ConversationMessageCut(heard_text(TEXT, 0.25), 1)]
    # Stamped before the audio began (clock skew): nothing of it heard, not a negative part.
    early = TakenOver(handed_over_us=started - 200_000)
    assert decide(log.state(), early, Policy(), started + 500_000) == [
        ev.ConversationMessageCut(CUT_MARK.strip(), 1)]


def test_the_cut_keeps_a_takeover_from_resuming_a_handle_that_holds_the_whole_message():
    log, started = greeting_playing()
    assert choose_resumption(log.state(), Policy(), log.now_us) == "h1"
    log.add(*takeover_at(log, started + 500_000))
    state = log.state()
    assert choose_resumption(state, Policy(), log.now_us) is None  # seeded instead
    assert state.conversation[-1] == ("assistant", heard_text(TEXT, 0.25))
    assert state.playing is None and state.cut_notes == []  # (nobody to tell)


def played(*after: ev.Event, audio_s: float | None = 2.0) -> Log:
    log = connected()
    log.add(ev.BotStartedSpeaking(1),
            ev.ConversationMessage("assistant", TEXT, 1, audio_s=audio_s,
                                   audio_from_us=log.now_us if audio_s else None),
            *after, ev.WorkerAttached("w2", 2))
    return log


def test_only_a_message_still_playing_is_cut():
    # Its speech stopped on the transport (it played out), it was interrupted, or the
    # audio's length is unknown (older logs): nothing to decide at a takeover.
    for ending in (ev.BotStoppedSpeaking(1, "transport"), ev.Interrupted(1),
                   ev.BotStoppedSpeaking(1, "timeout")):
        log = played(ending)
        assert takeover_at(log, log.now_us) == [], ending
    log = played(audio_s=None)
    assert takeover_at(log, log.now_us) == []
    # The model's turnComplete ends its turn, not the audio still playing.
    log = played(ev.BotStoppedSpeaking(1, "turn_complete"))
    assert takeover_at(log, log.now_us) == [ev.ConversationMessageCut(CUT_MARK.strip(), 1)]


def test_the_message_plays_from_its_first_audio_and_survives_a_snapshot():
    log, started = greeting_playing()
    state = log.state()
    assert state.playing is not None and state.playing.started_us == started
    assert from_snapshot(to_snapshot(state)).playing == state.playing


def test_the_bots_message_carries_its_audio_and_the_observation_reads_back():
    log = connected()
    obs = TranscriptFlushed(1, (), TEXT, None, 1.23456, 1_700_000_000_000_000)
    events = decided(log, obs)
    assert events == [ev.ConversationMessage("assistant", TEXT, 1, audio_s=1.235,
                                             audio_from_us=1_700_000_000_000_000)]
    record = observation_record(obs, events, log.state())
    again, _ = observation_of(ev.decode(record.TYPE, record.SCHEMA, json.loads(
        canonical_json(record.to_data()))), events)
    assert again == obs and decide(log.state(), again, Policy()) == events
    taken = TakenOver()
    record = observation_record(taken, [ev.Interrupted(1)], log.state())
    assert observation_of(record, [ev.Interrupted(1)])[0] == taken
