"""Decisions the service used to make in its shell, now pure: which handles are withheld
(session_store.withholding, on the gate the log folds), the answer owed for a call stopped
without a result, a result kept while the log was down, an intermediate result's part
number, and the transport's speech carried across a new or closed session. Hand-built
streams, no I/O."""

from __future__ import annotations

from session_store import events as ev
from session_store.answers import (STOPPED_ERROR, cancelled_on_wire, next_progress,
                                   stopped_failure, unless_answered)
from session_store.compaction import compact
from session_store.decide import (HandleArrived, ModelOutputObserved, ResultArrived,
                                  SessionLeft, SessionReady, decide)
from session_store.policy import Policy
from session_store.projection import from_snapshot, to_snapshot
from session_store.state import Withholding
from session_store.storable import Unstorable
from session_store.withholding import after_all, model_output

from .helpers import T0_US, Log, opened

ALL = Policy()


def running(*call_ids: str) -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1))
    for cid in call_ids:
        log.add(ev.ToolCallRequested(cid, "lookup", {}, 1), ev.ToolCallStarted(cid, 1, cid, 1))
    return log


# --------------------------------------------------------------------------- handles
# The gate is folded from the log (SessionState.withholding); a handle is decided on it
# (decide.HandleArrived); a server message is logged only if it moves the gate.

def gate_log() -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1))
    return log


def arrived(log: Log, generation: int, handle: str, index: int | None = None) -> ev.Event:
    """decide on a handle arriving, its event added to the log."""
    [decided] = decide(log.state(), HandleArrived(generation, handle, index), ALL)
    log.add(decided)
    return decided


def output(log: Log, generation: int, *, reaction: bool = True,
           turn_ended: bool = False) -> ev.Event | None:
    """A server message's model output, decided as the driver decides it (logged only if
    it moves the gate), and the service's test of whether to hand it over agrees."""
    obs = ModelOutputObserved(generation, reaction, turn_ended)
    decided = decide(log.state(), obs, ALL)
    handed_over = model_output(log.state().withholding, generation, reaction=reaction,
                               turn_ended=turn_ended) is not None
    assert handed_over == bool(decided)
    if not decided:
        return None
    [moved] = decided
    log.add(moved)
    return moved


def test_a_session_that_holds_all_it_was_told_issues_its_handles():
    log = gate_log()
    log.add(ev.HoldsAll(1))
    assert arrived(log, 1, "h1", 3) == ev.HandleIssued(1, "h1", 3)


def test_handles_after_a_send_are_withheld_until_the_model_reacts():
    log = gate_log()
    log.add(ev.HoldsAll(1), ev.SendUnread(1, turn_under_way=False))
    assert arrived(log, 1, "h1") == ev.HandleWithheld(1, "h1")
    assert output(log, 1) == ev.ModelReacted(1)
    assert output(log, 1) is None  # (the rest of the turn moves nothing: not logged)
    assert arrived(log, 1, "h2", 7) == ev.HandleIssued(1, "h2", 7)


def test_a_turn_under_way_at_the_send_must_end_before_a_reaction_counts():
    log = gate_log()
    log.add(ev.SendUnread(1, turn_under_way=True))
    assert output(log, 1) is None  # output of the turn begun before the send
    assert arrived(log, 1, "h1") == ev.HandleWithheld(1, "h1")
    assert output(log, 1, turn_ended=True) == ev.EarlierTurnEnded(1)  # that turn is over
    assert arrived(log, 1, "h2") == ev.HandleWithheld(1, "h2")
    assert output(log, 1, reaction=False, turn_ended=True) is None  # (an end, no output)
    assert output(log, 1) == ev.ModelReacted(1)  # the next turn reacts to the send
    assert arrived(log, 1, "h3") == ev.HandleIssued(1, "h3", None)


def test_a_send_during_a_turn_stays_behind_that_turn_when_another_send_follows():
    log = gate_log()
    log.add(ev.HoldsAll(1), ev.SendUnread(1, turn_under_way=True), ev.SendUnread(1, False))
    assert log.state().withholding == Withholding(0, 1, True)
    assert output(log, 1) is None
    assert arrived(log, 1, "h1") == ev.HandleWithheld(1, "h1")


def test_a_send_on_another_session_is_not_this_ones():
    log = gate_log()
    log.add(ev.SendUnread(1, False), ev.Connected(2), ev.HoldsAll(2))
    assert output(log, 2) is None
    assert arrived(log, 2, "h") == ev.HandleIssued(2, "h", None)
    assert arrived(log, 1, "old") == ev.HandleWithheld(1, "old")


def test_a_fresh_session_withholds_its_handles_until_it_holds_all():
    """Before its seed (or the word that it needs none), nothing says a fresh session's
    state holds the conversation: its handles are withheld."""
    log = gate_log()
    assert log.state().withholding == Withholding()
    assert arrived(log, 1, "h0") == ev.HandleWithheld(1, "h0")


def test_the_gate_the_noted_facts_leave_is_the_one_the_log_folds():
    """The service decides what a message logs on the gate plus the facts noted and not
    committed yet (`after_all`): the same gate the fold reaches once they are in."""
    log = gate_log()
    noted = [ev.HoldsAll(1), ev.BotStartedSpeaking(1), ev.SendUnread(1, True),
             ev.EarlierTurnEnded(1)]
    expected = after_all(log.state().withholding, noted)
    log.add(*noted)
    assert log.state().withholding == expected == Withholding(0, 1, False)


def test_model_output_noted_and_not_committed_moves_the_gate_ahead():
    """A ModelOutputObserved noted (the driver's `gate()`) counts as the event decide will
    make of it, so a message after it is handed over (or not) on the gate the log will hold."""
    log = gate_log()
    log.add(ev.SendUnread(1, turn_under_way=True))
    noted = [ModelOutputObserved(1, reaction=True),  # the earlier turn's output: nothing
             ModelOutputObserved(1, turn_ended=True), ModelOutputObserved(1, reaction=True)]
    ahead = after_all(log.state().withholding, noted)
    for obs in noted:
        log.add(*decide(log.state(), obs, ALL))
    assert log.state().withholding == ahead == Withholding(1, 0, False)
    assert log.events[-2:] == [ev.EarlierTurnEnded(1), ev.ModelReacted(1)]


def test_a_snapshot_keeps_the_gate():
    log = gate_log()
    log.add(ev.HoldsAll(1), ev.SendUnread(1, True))
    state = from_snapshot(to_snapshot(compact(log.state())))
    assert state.withholding == Withholding(0, 1, True)


def test_a_log_without_the_gates_events_folds_to_the_gate_of_a_fresh_worker():
    """An old log (handles logged as issued or withheld by the worker's own gate) folds as
    before: the gate is empty, and every other part of the state is what it was."""
    log = gate_log()
    log.add(ev.HandleWithheld(1, "h0"), ev.HandleIssued(1, "h1", 2))
    state = log.state()
    assert state.withholding == Withholding()
    assert list(state.handles) == ["h1"] and state.newest_handle == "h1"


# --------------------------------------------------------------------------- results

def test_a_stopped_call_is_owed_an_explicit_failure():
    state = running("c1").state()
    assert stopped_failure(state, "c1", set()) == [
        ev.ToolCallFailed("c1", STOPPED_ERROR, outcome_unknown=True)]


def test_nothing_is_owed_for_a_call_gemini_cancelled_or_that_has_its_outcome():
    log = running("c1", "c2")
    log.add(ev.ToolCallCompleted("c2", {"ok": True}))
    state = log.state()
    assert stopped_failure(state, "c1", {"c1"}) == []  # cancelled on the wire
    assert stopped_failure(state, "c2", set()) == []  # answered already
    assert stopped_failure(state, "nope", set()) == []


def test_a_cancellation_of_the_id_that_re_asked_reaches_the_original():
    log = running("c1")
    state = log.state()
    state.calls["c1"].superseded_by = "c2"
    assert cancelled_on_wire(state, "c1", {"c2"})
    assert not cancelled_on_wire(state, "c1", {"c3"})


def test_a_kept_result_is_logged_unless_the_call_was_answered_meanwhile():
    log = running("c1")
    outcome = [ev.ToolCallCompleted("c1", {"ok": 1})]
    assert unless_answered(log.state(), "c1", outcome) == outcome
    log.add(*outcome)  # the failed append committed after all
    assert unless_answered(log.state(), "c1", outcome) == []


def test_intermediate_results_are_numbered_in_order_until_the_outcome():
    log = Log()
    log.add(opened(), ev.Connected(1), ev.ToolCallRequested("c1", "track", {}, 1, "non_blocking"),
            ev.ToolCallStarted("c1", 1, "c1", 1))
    first = next_progress(log.state(), "c1", {"p": 1}, "SILENT")
    assert first == [ev.ToolCallProgress("c1", 1, {"p": 1}, "SILENT")]
    log.add(*first)
    assert next_progress(log.state(), "c1", {"p": 2}, None) == [
        ev.ToolCallProgress("c1", 2, {"p": 2}, None)]
    log.add(ev.ToolCallCompleted("c1", {"done": True}))
    assert dropped(next_progress(log.state(), "c1", {"p": 3}, None)) == \
        "the call already has its outcome"


def dropped(events: list[ev.Event]) -> str:
    [anomaly] = events
    assert isinstance(anomaly, ev.AnomalyRecorded)
    assert anomaly.kind == "intermediate_result_dropped"
    return anomaly.detail["why"]


def test_an_intermediate_result_of_a_blocking_or_unknown_call_is_logged_as_dropped():
    state = running("c1").state()
    assert dropped(next_progress(state, "c1", {"p": 1}, "SILENT", "lookup")) == \
        "the call is blocking: the model takes one result"
    assert dropped(next_progress(state, "zz", {"p": 1}, "SILENT", "lookup")) == "no such call"


def test_an_intermediate_result_the_log_cannot_store_is_an_anomaly_not_a_part():
    log = Log()
    log.add(opened(), ev.Connected(1), ev.ToolCallRequested("c1", "track", {}, 1, "non_blocking"),
            ev.ToolCallStarted("c1", 1, "c1", 1))
    [anomaly] = next_progress(log.state(), "c1", {"p": float("nan")}, "SILENT")
    assert isinstance(anomaly, ev.AnomalyRecorded) and anomaly.kind == "unstorable_event"
    assert anomaly.detail["type"] == ev.ToolCallProgress.TYPE


def test_a_result_is_the_calls_outcome_with_the_scheduling_its_mode_takes():
    log = running("c1")
    log.add(ev.ToolCallRequested("c2", "track", {}, 1, "non_blocking"),
            ev.ToolCallStarted("c2", 1, "c2", 1))
    state = log.state()
    assert decide(state, ResultArrived("c1", "lookup", {"ok": 1}, run_llm=False), ALL) == [
        ev.ToolCallCompleted("c1", {"ok": 1})]
    assert decide(state, ResultArrived("c2", "track", {"ok": 2}, run_llm=False), ALL) == [
        ev.ToolCallCompleted("c2", {"ok": 2}, scheduling="SILENT")]
    assert decide(state, ResultArrived("c2", "track", {"ok": 2}), ALL) == [
        ev.ToolCallCompleted("c2", {"ok": 2}, scheduling="WHEN_IDLE")]


def test_a_result_for_no_known_call_or_a_second_one_is_an_anomaly():
    log = running("c1")
    log.add(ev.ToolCallCompleted("c1", {"ok": 1}))
    state = log.state()
    [unknown] = decide(state, ResultArrived("zz", "lookup", {"ok": 1}), ALL)
    [second] = decide(state, ResultArrived("c1", "lookup", {"ok": 2}), ALL)
    assert (unknown.kind, unknown.detail) == ("result_for_unknown_call",
                                              {"call_id": "zz", "name": "lookup"})
    assert (second.kind, second.detail) == ("second_result", {"call_id": "c1", "name": "lookup"})


def test_a_result_handed_over_again_is_nothing_once_the_call_has_it():
    log = running("c1")
    kept = ResultArrived("c1", "lookup", {"ok": 1}, again=True)
    assert decide(log.state(), kept, ALL) == [ev.ToolCallCompleted("c1", {"ok": 1})]
    log.add(ev.ToolCallCompleted("c1", {"ok": 1}))  # the failed append committed after all
    assert decide(log.state(), kept, ALL) == []
    assert decide(log.state(), ResultArrived("zz", "x", 1, again=True), ALL) == []


def test_a_result_the_log_cannot_store_answers_the_call_as_failed():
    state = running("c1", "c2").state()
    for call_id, value in (("c1", {"v": float("nan")}),
                           ("c2", Unstorable("RecursionError: too deep", "[[[["))):
        anomaly, failed = decide(state, ResultArrived(call_id, "lookup", value), ALL)
        assert isinstance(anomaly, ev.AnomalyRecorded) and anomaly.kind == "unstorable_event"
        assert isinstance(failed, ev.ToolCallFailed) and failed.call_id == call_id
        assert "cannot be stored" in failed.error
    [_, failed] = decide(state, ResultArrived("c2", "lookup", Unstorable("RecursionError: x")),
                         ALL)
    assert "RecursionError: x" in failed.error


# --------------------------------------------------------------------------- sessions

def test_the_transport_still_playing_is_speech_on_the_next_session():
    log = Log()
    log.add(opened())
    assert decide(log.state(), SessionReady(1, None, "sha", transport_playing=False), ALL) == [
        ev.Connected(1, None, "sha")]
    assert decide(log.state(), SessionReady(1, "h", "sha", transport_playing=True), ALL) == [
        ev.Connected(1, "h", "sha"), ev.BotStartedSpeaking(1, "transport")]


def test_leaving_a_session_while_the_transport_plays_keeps_the_bot_speaking():
    log = Log()
    log.add(opened(), ev.Connected(1))
    assert decide(log.state(), SessionLeft(1, "go_away", transport_playing=True), ALL) == [
        ev.Disconnected(1, "go_away"), ev.BotStartedSpeaking(1, "transport")]
    log.add(ev.Disconnected(1, "error"))
    assert decide(log.state(), SessionLeft(1, "error"), ALL) == []  # nothing live to leave


def test_a_planned_leave_is_taken_only_if_its_reconnect_is_still_due():
    """A goAway's reconnect found due while the bot was silent; the model's next turn was
    committed before the leave: the leave waits (if_due), unless the deadline is near. A
    leave from an older log (if_due False) is taken as it was."""
    log = Log()
    log.add(opened(), ev.Connected(1))
    at = log.add(ev.GoAwayReceived(1, 30.0))
    leave = SessionLeft(1, "go_away", if_due=True)
    assert decide(log.state(), leave, ALL, T0_US) == [ev.Disconnected(1, "go_away")]
    log.add(ev.BotStartedSpeaking(1, "model"))
    assert decide(log.state(), leave, ALL, T0_US) == []
    assert decide(log.state(), SessionLeft(1, "go_away"), ALL, T0_US) == [
        ev.Disconnected(1, "go_away")]
    near = log.times[at - 1] + 26_000_000  # 4 s left, inside the 5 s margin
    assert decide(log.state(), leave, ALL, near) == [ev.Disconnected(1, "go_away")]


def test_a_result_after_the_hang_up_is_still_the_calls_outcome():
    log = running("c1")
    log.add(ev.SessionClosed("hangup"))
    assert decide(log.state(), ResultArrived("c1", "lookup", {"ok": 1}), ALL) == [
        ev.ToolCallCompleted("c1", {"ok": 1})]
