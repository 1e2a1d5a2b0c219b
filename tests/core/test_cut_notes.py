"""Telling the live session what the caller heard of a turn they cut short (cut_notes.py):
owed by the session that said the turn, told by clientContent where the generation takes a
note that starts no reply (2.5, 3.8), or by replacing the session with a fresh one seeded
from the log where none does (3.1, 3.8 thinking: "reseed", at the next safe point); logged
as an intent (and its confirmation), so a crash between the cut and the note neither loses
nor repeats it; replay decides it again."""

from __future__ import annotations

import pytest

from session_store import events as ev
from session_store.audit.replay import replay
from session_store.compaction import compact
from session_store.cut_notes import CUT_TURN, note_text
from session_store.delivery import Reconnect, TellCut, due, seed_plan
from session_store.intents import ALL as ALL_KINDS, intents
from session_store.policy import Policy
from session_store.projection import from_snapshot, to_snapshot

from .helpers import Log

POLICY = Policy()
SAID = "Your refund is done and the receipt goes to your email now"
HEARD = "Your refund is done —"
MODELS = {
    "2.5": "models/gemini-2.5-flash-native-audio-preview",
    "3.1": "models/gemini-3.1-flash-live-preview",
    "3.8": "models/gemini-3.8-live",
    "3.8-thinking": "models/gemini-3.8-live-extended-thinking",
}
HOW = {"2.5": "content", "3.1": "reseed", "3.8": "content", "3.8-thinking": "reseed"}


def cut_call(family: str = "2.5") -> tuple[Log, int]:
    """A call whose bot turn was cut on its live session; the cut's log version."""
    log = Log()
    log.add(ev.SessionOpened(MODELS[family], ["refund"], "w1"), ev.Connected(1),
            ev.ConversationMessage("user", "refund order 7", 1),
            ev.ConversationMessage("assistant", SAID, 1), ev.Interrupted(1))
    return log, log.add(ev.ConversationMessageCut(HEARD, 1))


def tells(log: Log) -> list[TellCut]:
    return [e for e in due(log.state(), POLICY, log.now_us) if isinstance(e, TellCut)]


@pytest.mark.parametrize("family", list(MODELS))
def test_each_generation_is_told_its_own_way_and_the_log_says_which(family):
    log, cut = cut_call(family)
    s = log.state()
    assert tells(log) == [TellCut(cut, HOW[family])]
    logged = intents(s, due(s, POLICY, log.now_us), ALL_KINDS, 1)
    if HOW[family] == "reseed":
        assert logged == [ev.CutTelling(1, cut, "reseed"), ev.ReconnectRequested(CUT_TURN)]
    else:
        assert logged == [ev.CutTelling(1, cut, "content")]
    log.add(*logged)
    assert tells(log) == []  # under way: never twice
    if HOW[family] == "content":
        log.add(ev.CutTold(1, cut, "content"))
        assert log.state().cut_notes == []
        assert not [e for e in due(log.state(), POLICY, log.now_us) if isinstance(e, Reconnect)]
        return
    # Replaced at once (the bot is silent: the cut stopped it) by a fresh session, seeded
    # with the heard part only.
    assert Reconnect(CUT_TURN) in due(log.state(), POLICY, log.now_us)
    log.add(ev.Disconnected(1, CUT_TURN), ev.Connected(2))
    s = log.state()
    assert s.cut_notes == [] and s.reconnect_pending is None
    turns = seed_plan(s).turns
    assert ("assistant", HEARD) in turns and not [t for t in turns if SAID in t[1]]


@pytest.mark.parametrize("family", ["3.1", "3.8-thinking"])
def test_a_session_replaced_for_a_cut_turn_is_replaced_at_a_safe_point(family):
    """Not while the bot speaks (its answer to the caller would be cut off) nor, on 3.8
    thinking, while the model says it is still working."""
    log, cut = cut_call(family)
    log.add(ev.BotStartedSpeaking(1))  # the model answers the caller who cut in
    if family == "3.8-thinking":
        log.add(ev.InteractionStatus(1, "IN_PROGRESS"))
    s = log.state()
    log.add(*intents(s, due(s, POLICY, log.now_us), ALL_KINDS, 1))  # decided at once
    assert log.state().reconnect_pending == CUT_TURN

    def reconnects() -> list:
        return [e for e in due(log.state(), POLICY, log.now_us) if isinstance(e, Reconnect)]

    assert reconnects() == []
    log.add(ev.BotStoppedSpeaking(1))
    if family == "3.8-thinking":
        assert reconnects() == []
        log.add(ev.InteractionStatus(1, "IDLE"))
    assert reconnects() == [Reconnect(CUT_TURN)]


def test_the_note_waits_while_the_bot_speaks():
    log, cut = cut_call()
    log.add(ev.BotStartedSpeaking(1))
    assert tells(log) == []  # content would cut the model's answer off
    log.add(ev.BotStoppedSpeaking(1))
    assert tells(log) == [TellCut(cut, "content")]


@pytest.mark.parametrize("told", [False, True], ids=["before-the-intent", "after-the-intent"])
def test_a_takeover_between_the_cut_and_the_note_owes_none(told):
    """The new session is fresh, seeded with the heard part: the note was owed only to the
    session that died, so it is neither sent again nor lost."""
    log, cut = cut_call()
    if told:
        log.add(ev.CutTelling(1, cut, "content"))  # crashed before the send returned
    log.add(ev.WorkerAttached("w2", 2), ev.Connected(2))
    assert tells(log) == [] and log.state().cut_notes == []
    turns = seed_plan(log.state()).turns
    assert ("assistant", HEARD) in turns and not [t for t in turns if SAID in t[1]]


def test_a_cut_logged_after_its_session_ended_is_owed_to_nobody():
    log = Log()
    log.add(ev.SessionOpened(MODELS["2.5"], [], "w1"), ev.Connected(1),
            ev.ConversationMessage("assistant", SAID, 1), ev.Disconnected(1, "error"),
            ev.Connected(2), ev.ConversationMessageCut(HEARD, 1))
    assert tells(log) == [] and log.state().cut_notes == []


def test_an_owed_note_survives_snapshots_and_compaction():
    log, cut = cut_call()
    s = log.state()
    assert from_snapshot(to_snapshot(s)).cut_notes == s.cut_notes
    compacted = from_snapshot(to_snapshot(compact(s)))
    assert compacted.cut_notes == s.cut_notes
    assert [e for e in due(compacted, POLICY, log.now_us)
            if isinstance(e, TellCut)] == [TellCut(cut, "content")]


def test_the_note_says_what_was_heard_and_nothing_of_the_rest():
    note = note_text(HEARD)
    assert '"Your refund is done"' in note and "receipt" not in note and "—" not in note
    assert "none of it" in note_text("—")


@pytest.mark.parametrize("family", ["2.5", "3.1"])
def test_replay_decides_the_note_again_and_catches_a_wrong_one(family):
    log, cut = cut_call(family)
    s = log.state()
    log.add(*intents(s, due(s, POLICY, log.now_us), ALL_KINDS, 1))
    if family == "2.5":
        log.add(ev.CutTold(1, cut, "content"))
    else:
        log.add(ev.Disconnected(1, CUT_TURN), ev.Connected(2))
    report = replay(log.records(), POLICY)
    assert report.divergences == [], report.divergences
    # A log that told a 3.1 session by content, or left one untold (as code before
    # 2026-12-07 did), or left a 2.5 one untold, is not what today decides.
    wrong_notes = ([ev.CutTelling(1, cut, "content"), ev.CutUntold(1, cut, "no")]
                   if family == "3.1" else [ev.CutUntold(1, cut, "no")])
    for note in wrong_notes:
        wrong, _ = cut_call(family)
        wrong.add(note)
        assert [d.kind for d in replay(wrong.records(), POLICY).divergences] == ["due"]


def test_replay_catches_a_replacement_for_a_cut_turn_while_the_bot_spoke():
    log, cut = cut_call("3.1")
    s = log.state()
    log.add(*intents(s, due(s, POLICY, log.now_us), ALL_KINDS, 1))
    log.add(ev.BotStartedSpeaking(1), ev.Disconnected(1, CUT_TURN))
    assert [d.kind for d in replay(log.records(), POLICY).divergences] == ["due"]
