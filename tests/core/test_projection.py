"""decide / evolve / due on hand-built streams: deferral (I4), buffered reconnect (I5),
goAway, cancellation, calls in doubt after a takeover (I3), malformed tool calls."""

from __future__ import annotations

import pytest

from session_store import events as ev
from session_store.decide import (CancellationArrived, FunctionCall, GoAway, InterruptionObserved,
                                  SettingsUpdate, SpeechStarted, SpeechStopped, ToolCallsArrived,
                                  decide)
from session_store.delivery import (OUTCOME_UNKNOWN, Reconnect, ResolveInDoubt, StartCall, due,
                                    unanswered, undelivered, waits_for_silence)
from session_store.policy import Policy

from .helpers import Log, opened

ALL = Policy()


def live(speaking: bool = False, epoch: int = 1) -> Log:
    log = Log()
    log.add(opened(epoch=epoch), ev.Connected(1))
    if speaking:
        log.add(ev.BotStartedSpeaking(1))
    return log


def calls(*specs) -> ToolCallsArrived:
    return ToolCallsArrived(tuple(FunctionCall(cid, name, args) for cid, name, args in specs), 1)


def observe(log: Log, obs, policy: Policy = ALL) -> list[ev.Event]:
    out = decide(log.state(), obs, policy)
    if out:
        log.add(*out)
    return out


def starts(effects) -> list[str]:
    return [e.call_id for e in effects if isinstance(e, StartCall)]


def reconnects(effects) -> list[Reconnect]:
    return [e for e in effects if isinstance(e, Reconnect)]


# --------------------------------------------------------------------------- deferral (I4)

def test_calls_while_speaking_are_deferred_and_start_in_request_order_when_it_stops():
    log = live(speaking=True)
    out = observe(log, calls(("c3", "lookup", {"q": 1}), ("c1", "book", {}),
                             ("c2", "lookup", {"q": 2})))
    assert out == [ev.ToolCallRequested("c3", "lookup", {"q": 1}, 1), ev.ToolCallDeferred("c3"),
                   ev.ToolCallRequested("c1", "book", {}, 1), ev.ToolCallDeferred("c1"),
                   ev.ToolCallRequested("c2", "lookup", {"q": 2}, 1), ev.ToolCallDeferred("c2")]
    s = log.state()
    assert [c.call_id for c in s.pending()] == ["c3", "c1", "c2"]
    assert starts(due(s, ALL, log.now_us)) == []

    assert observe(log, SpeechStopped(1)) == [ev.BotStoppedSpeaking(1, "turn_complete")]
    effects = due(log.state(), ALL, log.now_us)
    assert [e for e in effects if isinstance(e, StartCall)] == [
        StartCall("c3", 1, "call-1:c3"), StartCall("c1", 1, "call-1:c1"),
        StartCall("c2", 1, "call-1:c2")]


def test_calls_while_silent_start_at_once():
    log = live()
    assert observe(log, calls(("c1", "lookup", {}))) == [
        ev.ToolCallRequested("c1", "lookup", {}, 1)]
    assert due(log.state(), ALL, log.now_us) == [StartCall("c1", 1, "call-1:c1")]


def test_policy_decides_which_tools_defer():
    log = live(speaking=True)
    some = Policy(defer=frozenset({"book"}))
    out = observe(log, calls(("c1", "lookup", {}), ("c2", "book", {})), some)
    assert ev.ToolCallDeferred("c2") in out and ev.ToolCallDeferred("c1") not in out
    assert starts(due(log.state(), some, log.now_us)) == ["c1"]
    none = Policy(defer="none")
    assert ev.ToolCallDeferred("c3") not in observe(log, calls(("c3", "book", {})), none)


def test_a_call_requested_while_silent_does_not_start_once_the_bot_speaks():
    """I4 at the state level: the bot started speaking before the call was started."""
    log = live()
    observe(log, calls(("c1", "lookup", {})))
    observe(log, SpeechStarted(1))
    assert starts(due(log.state(), ALL, log.now_us)) == []
    assert starts(due(log.state(), Policy(defer="none"), log.now_us)) == ["c1"]
    observe(log, SpeechStopped(1))
    assert starts(due(log.state(), ALL, log.now_us)) == ["c1"]


def test_a_deferred_call_waits_for_silence_under_any_policy():
    """I4 across a policy change (a worker taking the call over with another configuration):
    a call the log says was deferred still waits for the bot to stop speaking, though the
    new policy would not defer its tool."""
    log = live(speaking=True)
    observe(log, calls(("c1", "lookup", {})))
    assert log.state().calls["c1"].status == "deferred"
    none = Policy(defer="none")
    assert starts(due(log.state(), none, log.now_us)) == []
    observe(log, SpeechStopped(1))
    assert starts(due(log.state(), none, log.now_us)) == ["c1"]

def test_speech_observations_are_idempotent_and_interruption_stops_speaking():
    log = live()
    assert observe(log, SpeechStopped(1)) == []
    assert observe(log, SpeechStarted(1)) == [ev.BotStartedSpeaking(1, "model")]
    assert observe(log, SpeechStarted(1)) == []
    assert observe(log, InterruptionObserved(1)) == [ev.Interrupted(1)]
    assert not log.state().bot_speaking


# --------------------------------------------------------------------------- reconnect (I5)

def test_settings_reconnect_waits_for_turn_end_and_for_deferred_calls_to_start():
    log = live(speaking=True)
    observe(log, calls(("c1", "lookup", {})))
    out = observe(log, SettingsUpdate(("system_instruction",), {"system_instruction": "new"}))
    assert out == [ev.SettingsChanged(["system_instruction"], {"system_instruction": "new"},
                                      True),
                   ev.ReconnectRequested("settings", ["system_instruction"])]
    assert log.state().reconnect_pending == "settings"
    assert reconnects(due(log.state(), ALL, log.now_us)) == []  # mid-turn: buffered

    observe(log, SpeechStopped(1))
    effects = due(log.state(), ALL, log.now_us)
    assert starts(effects) == ["c1"] and reconnects(effects) == []  # calls start first

    log.add(ev.ToolCallStarted("c1", 1, "call-1:c1", 1))
    assert due(log.state(), ALL, log.now_us) == [Reconnect("settings")]

    log.add(ev.Disconnected(1, "settings"), ev.Connected(2))
    s = log.state()
    assert s.reconnect_pending is None and s.reconnects == 1
    assert due(s, ALL, log.now_us) == []


def test_settings_buffered_in_one_turn_accumulate_the_keys_the_reconnect_is_for():
    """Two changes needing a reconnect in one turn: the one buffered reconnect is for both
    (what the state, and the audit export, says it is waiting for)."""
    log = live(speaking=True)
    observe(log, SettingsUpdate(("system_instruction",), {"system_instruction": "new"}))
    observe(log, SettingsUpdate(("voice",), {"voice": "Puck"}))
    s = log.state()
    assert s.reconnect_pending == "settings"
    assert s.reconnect_keys == ["system_instruction", "voice"]
    observe(log, SpeechStopped(1))
    assert due(log.state(), ALL, log.now_us) == [Reconnect("settings")]
    log.add(ev.Disconnected(1, "settings"), ev.Connected(2))
    assert log.state().reconnect_keys == []

def test_waits_for_silence_while_a_call_or_a_reconnect_waits_for_the_bot_to_stop():
    """What makes the shell log a stop at once rather than lazily."""
    log = live(speaking=True)
    assert not waits_for_silence(log.state())  # speaking, nothing waiting: a stop can wait
    observe(log, calls(("c1", "lookup", {})))
    assert waits_for_silence(log.state())  # deferred
    log.add(ev.ToolCallStarted("c1", 1, "call-1:c1", 1))
    assert not waits_for_silence(log.state())
    observe(log, SettingsUpdate(("system_instruction",), {"system_instruction": "new"}))
    assert waits_for_silence(log.state())  # a reconnect buffered until the turn ends
    quiet = live()
    observe(quiet, calls(("c2", "lookup", {})))
    assert quiet.state().calls["c2"].status == "requested"  # not started yet: waits too
    assert waits_for_silence(quiet.state())


def test_every_settings_change_needs_a_new_session_on_a_model_without_context_update():
    log = live()  # "gemini-live": no version, ruled as 2.5
    assert observe(log, SettingsUpdate(("temperature",), {"temperature": 0.3})) == [
        ev.SettingsChanged(["temperature"], {"temperature": 0.3}, True, False),
        ev.ReconnectRequested("settings", ["temperature"])]
    s = log.state()
    assert s.settings == {"temperature": 0.3} and s.reconnect_pending == "settings"


def test_go_away_reconnects_at_turn_end_or_before_the_deadline():
    log = live(speaking=True)
    t = log.now_us
    assert observe(log, GoAway(1, 60.0)) == [ev.GoAwayReceived(1, 60.0)]
    s = log.state()
    assert s.reconnect_pending == "go_away"
    assert s.go_away_deadline_us == log.times[-1] + 60_000_000
    assert reconnects(due(s, ALL, t + 10_000_000)) == []  # speaking, deadline far
    assert reconnects(due(s, ALL, t + 56_000_000)) == [Reconnect("go_away")]  # margin 5 s
    at_margin = s.go_away_deadline_us - 5_000_000  # the margin's first instant counts
    assert reconnects(due(s, ALL, at_margin - 1)) == []
    assert reconnects(due(s, ALL, at_margin)) == [Reconnect("go_away")]
    wide = Policy(go_away_margin_s=30)
    assert reconnects(due(s, wide, t + 31_000_000)) == [Reconnect("go_away")]
    observe(log, SpeechStopped(1))
    assert due(log.state(), ALL, t + 1_000_000) == [Reconnect("go_away")]


def test_a_go_away_during_a_buffered_settings_reconnect_keeps_its_reason():
    """A settings reconnect is buffered mid-turn, then a goAway comes: one reconnect is due,
    still for the settings (the reason it is logged and paced under); the goAway only adds
    its deadline."""
    log = live(speaking=True)
    observe(log, SettingsUpdate(("system_instruction",), {"system_instruction": "new"}))
    observe(log, GoAway(1, 60.0))
    s = log.state()
    assert s.reconnect_pending == "settings"
    assert s.go_away_deadline_us == log.times[-1] + 60_000_000
    assert reconnects(due(s, ALL, log.now_us + 56_000_000)) == [Reconnect("settings")]

def test_a_go_away_deadline_ends_with_its_session():
    """After the goAway reconnect, the old session's deadline is gone: a settings change on
    the new session, mid-turn and long after that deadline, is still buffered until the turn
    ends (I5), not rushed through as if the new session were about to be closed."""
    log = live()
    observe(log, GoAway(1, 60.0))
    log.add(ev.Disconnected(1, "go_away"), ev.Connected(2))
    assert log.state().go_away_deadline_us is None
    log.add(ev.BotStartedSpeaking(2), at_us=log.now_us + 120_000_000)
    observe(log, SettingsUpdate(("system_instruction",), {"system_instruction": "new"}))
    assert reconnects(due(log.state(), ALL, log.now_us)) == []
    observe(log, SpeechStopped(2))
    assert reconnects(due(log.state(), ALL, log.now_us)) == [Reconnect("settings")]

def test_lost_connection_reconnects_at_once():
    log = live(speaking=True)
    log.add(ev.Disconnected(1, "error", "1011"))
    s = log.state()
    assert not s.connected and not s.bot_speaking
    assert due(s, ALL, log.now_us) == [Reconnect("connection_lost")]
    log.add(ev.SessionClosed())
    assert due(log.state(), ALL, log.now_us) == []


def test_disconnect_of_an_old_generation_is_ignored():
    log = live()
    log.add(ev.Connected(2), ev.Disconnected(1, "error"))
    assert log.state().connected and log.state().generation == 2


# --------------------------------------------------------------------------- cancellation

def test_cancelled_before_start_never_runs():
    log = live(speaking=True)
    observe(log, calls(("c1", "book", {}), ("c2", "book", {"x": 1})))
    assert observe(log, CancellationArrived(("c1",), 1)) == [ev.ToolCallCancelled("c1", "server")]
    assert observe(log, CancellationArrived(("c1",), 1)) == []  # already cancelled
    observe(log, SpeechStopped(1))
    s = log.state()
    assert starts(due(s, ALL, log.now_us)) == ["c2"]
    assert s.calls["c1"].status == "cancelled" and s.calls["c1"].cancel_reason == "server"
    assert [c.call_id for c in unanswered(s)] == ["c2"]  # I1: a cancelled call is settled


def test_cancelled_after_start_sends_no_result():
    log = live()
    observe(log, calls(("c1", "book", {})))
    log.add(ev.ToolCallStarted("c1", 1, "call-1:c1", 1))
    observe(log, CancellationArrived(("c1",), 1))
    log.add(ev.ToolCallCompleted("c1", {"booked": True}))  # the tool finished anyway
    s = log.state()
    assert s.calls["c1"].status == "cancelled" and s.calls["c1"].finished_at_us
    assert due(s, ALL, log.now_us) == [] and undelivered(s) == [] and unanswered(s) == []


def test_cancellation_of_unknown_or_delivered_calls():
    log = live()
    out = observe(log, CancellationArrived(("nope",), 1))
    assert out == [ev.AnomalyRecorded("cancellation_for_unknown_call", {"call_id": "nope"}, 1)]
    observe(log, calls(("c1", "lookup", {})))
    log.add(ev.ToolCallStarted("c1", 1, "k", 1), ev.ToolCallCompleted("c1", 1),
            ev.ToolResultSending("c1", 1, "tool_response"), ev.ToolResultSent("c1", 1,
                                                                              "tool_response"))
    assert observe(log, CancellationArrived(("c1",), 1)) == []  # the answer is already in
    assert log.state().anomalies == 1


def test_an_id_repeated_in_one_cancellation_is_cancelled_once():
    log = live(speaking=True)
    observe(log, calls(("c1", "lookup", {}), ("c2", "book", {})))
    assert observe(log, CancellationArrived(("c1", "c2", "c1"), 1)) == [
        ev.ToolCallCancelled("c1", "server"), ev.ToolCallCancelled("c2", "server")]

# --------------------------------------------------------------------------- in doubt (I3)

def _in_doubt_log(key: str = "call-1:c1") -> Log:
    log = live()
    observe(log, calls(("c1", "book", {"seat": "4A"})))
    log.add(ev.ToolCallStarted("c1", 1, key, 1), ev.WorkerAttached("w2", 2))
    return log


def test_in_doubt_idempotent_tool_reruns_with_the_same_key():
    log = _in_doubt_log(key="booking-7f3")
    s = log.state()
    assert [c.call_id for c in s.in_doubt()] == ["c1"] and s.running() == []
    assert s.epoch == 2 and s.takeovers == 1 and not s.connected
    idem = Policy(idempotent=frozenset({"book"}))
    assert due(s, idem, log.now_us) == [StartCall("c1", 2, "booking-7f3"),
                                        Reconnect("takeover")]
    log.add(ev.ToolCallStarted("c1", 2, "booking-7f3", 2))
    s = log.state()
    assert s.in_doubt() == [] and [c.call_id for c in s.running()] == ["c1"]
    assert starts(due(s, idem, log.now_us)) == []


def test_in_doubt_other_tool_gets_outcome_unknown():
    log = _in_doubt_log()
    assert due(log.state(), ALL, log.now_us) == [ResolveInDoubt("c1"), Reconnect("takeover")]
    log.add(ev.ToolCallFailed("c1", OUTCOME_UNKNOWN, outcome_unknown=True))
    s = log.state()
    c1 = s.calls["c1"]
    assert c1.status == "failed" and c1.outcome_unknown and s.in_doubt() == []
    assert [c.call_id for c in undelivered(s)] == ["c1"]  # the model must be told
    assert due(s, ALL, log.now_us) == [Reconnect("takeover")]  # sent once connected


def test_a_call_started_by_the_current_worker_is_not_in_doubt():
    log = live(epoch=3)
    observe(log, calls(("c1", "book", {})))
    log.add(ev.ToolCallStarted("c1", 1, "k", 3))
    s = log.state()
    assert s.in_doubt() == [] and [c.call_id for c in s.running()] == ["c1"]
    assert due(s, ALL, log.now_us) == []


# --------------------------------------------------------------------------- malformed input

def test_malformed_tool_calls_are_recorded_not_dropped():
    log = live()
    log.add(*decide(log.state(), calls(("c1", "lookup", {})), ALL))
    out = decide(log.state(), ToolCallsArrived((
        FunctionCall("c2", None, {"a": 1}), FunctionCall(None, "lookup", {}),
        FunctionCall("c1", "lookup", {}), FunctionCall("c3", "lookup", "plain"),
        FunctionCall("c3", "lookup", {})), 1), ALL)
    assert [e.kind for e in out if isinstance(e, ev.AnomalyRecorded)] == [
        "tool_call_without_name", "tool_call_without_id", "duplicate_tool_call_id",
        "duplicate_tool_call_id"]
    assert ev.ToolCallRequested("c3", "lookup", {"_value": "plain"}, 1) in out


@pytest.mark.parametrize("obs", [object(), None])
def test_unknown_observation_is_an_error(obs):
    with pytest.raises(TypeError):
        decide(live().state(), obs, ALL)


def test_a_message_cut_replaces_the_bots_last_message():
    log = Log()
    log.add(opened(), ev.Connected(1), ev.ConversationMessage("user", "refund my order", 1),
            ev.ConversationMessage("assistant", "Sure, which one was it", 1),
            ev.ConversationMessage("user", "the blue one", 1),
            ev.ConversationMessage("assistant", "I will refund the blue one now", 1),
            ev.ConversationMessageCut("I will refund —", 1))
    state = log.state()
    assert state.conversation == [("user", "refund my order"),
                                  ("assistant", "Sure, which one was it"),
                                  ("user", "the blue one"), ("assistant", "I will refund —")]
    assert state.messages == 4 and len(state.message_marks) == 4
