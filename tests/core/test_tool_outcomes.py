"""What becomes of a tool call the call's end or a crash caught mid-run (pure: hand-built
streams). A closed call never projects `running`: a tool's outcome logged after the hang-up
is "finished after the end"; one never logged is in doubt. A call in doubt whose tool has an
outcome check is asked before anything else is decided, and the answer decides: the real
result, "not done" (or a re-run, where the tool allows it), "outcome unknown" only when the
check cannot tell."""

from __future__ import annotations

import pytest

from session_store import events as ev
from session_store.decide import FunctionCall, OutcomeAnswered, ToolCallsArrived, decide
from session_store.delivery import (OUTCOME_UNKNOWN, CheckOutcome, Reconnect, ResolveInDoubt,
                                    StartCall, due, undelivered)
from session_store.outcomes import (NOT_DONE_ERROR, CannotTell, Done, NotAnAnswer, NotDone,
                                    answer_events)
from session_store.policy import Policy
from session_store.projection import from_snapshot, to_snapshot
from session_store.storable import Unstorable

from .helpers import Log, opened

CHECKED = Policy(outcome_checks={"refund"})
RERUN = Policy(outcome_checks={"refund"}, rerun_if_not_done={"refund"})


def _started(epoch_after: int | None = 2) -> Log:
    """c1 (refund) started by worker 1; then worker 2 took over (epoch_after) or not."""
    log = Log()
    log.add(opened(), ev.Connected(1))
    log.add(*decide(log.state(), ToolCallsArrived((FunctionCall("c1", "refund", {"o": 7}),), 1),
                    Policy()))
    log.add(ev.ToolCallStarted("c1", 1, "call-1:c1", 1))
    if epoch_after:
        log.add(ev.WorkerAttached("w2", epoch_after))
    return log


def _answer(log: Log, answer, policy: Policy = CHECKED) -> list[ev.Event]:
    out = decide(log.state(), OutcomeAnswered("c1", answer), policy)
    log.add(*out)
    return out


# --------------------------------------------------------------------------- the call's end

def test_a_tool_running_at_the_hang_up_is_in_doubt_not_running():
    log = _started(epoch_after=None)
    assert [c.call_id for c in log.state().running()] == ["c1"]
    log.add(ev.Disconnected(1, "shutdown"), ev.SessionClosed("ended"))
    s = log.state()
    assert s.running() == [] and [c.call_id for c in s.in_doubt()] == ["c1"]
    assert due(s, CHECKED, log.now_us) == []  # nobody is on an ended call: nothing is due


def test_an_outcome_logged_after_the_hang_up_is_finished_after_the_end():
    log = _started(epoch_after=None)
    log.add(ev.SessionClosed("ended"), ev.ToolCallCompleted("c1", {"refunded": True}))
    s = log.state()
    c1 = s.calls["c1"]
    assert (c1.status, c1.result, c1.finished_after_end) == ("completed", {"refunded": True},
                                                             True)
    assert s.running() == [] and s.in_doubt() == [] and s.finished_after_end() == [c1]
    # A failure after the end too; an outcome before it is not "after the end".
    log = _started(epoch_after=None)
    log.add(ev.ToolCallFailed("c1", "boom"), ev.SessionClosed("ended"))
    assert log.state().finished_after_end() == []
    log = _started(epoch_after=None)
    log.add(ev.SessionClosed("ended"), ev.ToolCallFailed("c1", "boom"))
    assert [c.call_id for c in log.state().finished_after_end()] == ["c1"]


def test_nothing_is_decided_on_a_closed_call_not_even_a_check():
    log = _started()
    log.add(ev.SessionClosed("ended"))
    assert decide(log.state(), OutcomeAnswered("c1", Done({"x": 1})), CHECKED) == []


# --------------------------------------------------------------------------- outcome checks

def test_a_checked_tool_in_doubt_is_asked_before_anything_else():
    s = _started().state()
    assert due(s, CHECKED, 0) == [CheckOutcome("c1", "call-1:c1"), Reconnect("takeover")]
    # Without a check: outcome unknown, as before; an idempotent tool re-runs (no check).
    assert due(s, Policy(), 0)[0] == ResolveInDoubt("c1")
    both = Policy(outcome_checks={"refund"}, idempotent={"refund"})
    assert due(s, both, 0)[0] == StartCall("c1", 2, "call-1:c1")


def test_done_answers_the_model_with_the_real_result():
    log = _started()
    assert _answer(log, Done({"refunded": True, "amount": "59.90"})) == [
        ev.ToolOutcomeChecked("c1", "done"),
        ev.ToolCallCompleted("c1", {"refunded": True, "amount": "59.90"})]
    s = log.state()
    c1 = s.calls["c1"]
    assert (c1.status, c1.checked, c1.outcome_unknown) == ("completed", "done", False)
    assert s.in_doubt() == [] and undelivered(s) == [c1]
    assert due(s, CHECKED, log.now_us) == [Reconnect("takeover")]  # sent once connected


def test_not_done_is_answered_as_not_done_unless_a_rerun_is_safe():
    log = _started()
    assert _answer(log, NotDone()) == [ev.ToolOutcomeChecked("c1", "not_done"),
                                       ev.ToolCallFailed("c1", NOT_DONE_ERROR)]
    c1 = log.state().calls["c1"]
    assert (c1.status, c1.outcome_unknown) == ("failed", False)
    assert "outcome unknown" not in c1.error

    log = _started()
    assert _answer(log, NotDone(), RERUN) == [ev.ToolOutcomeChecked("c1", "not_done")]
    s = log.state()
    # Still in doubt until it runs again, with the same key; the decision is in the log,
    # so a worker without the policy (replay) decides the same.
    for policy in (RERUN, Policy()):
        assert due(s, policy, log.now_us)[0] == StartCall("c1", 2, "call-1:c1")
    log.add(ev.ToolCallStarted("c1", 2, "call-1:c1", 2))
    s = log.state()
    assert s.calls["c1"].checked is None and [c.call_id for c in s.running()] == ["c1"]
    # The re-run dies too: the next worker asks the check again.
    log.add(ev.WorkerAttached("w3", 3))
    assert due(log.state(), RERUN, log.now_us)[0] == CheckOutcome("c1", "call-1:c1")


@pytest.mark.parametrize("reason", ["the ledger is down", "timed out after 5 s", ""])
def test_only_cannot_tell_is_outcome_unknown(reason):
    log = _started()
    assert _answer(log, CannotTell(reason), RERUN) == [
        ev.ToolOutcomeChecked("c1", "cannot_tell", reason),
        ev.ToolCallFailed("c1", OUTCOME_UNKNOWN, outcome_unknown=True)]
    c1 = log.state().calls["c1"]
    assert (c1.status, c1.outcome_unknown, c1.checked) == ("failed", True, "cannot_tell")


@pytest.mark.parametrize("result,problem", [
    ({"refunded": float("nan")}, "Out of range float"),
    ({"note": "\ud800"}, "surrogates not allowed"),
    (Unstorable("RecursionError: maximum recursion depth exceeded", "[[[["), "RecursionError"),
], ids=["nan", "lone_surrogate", "not_json"])
def test_a_done_whose_result_the_log_cannot_store_is_outcome_unknown(result, problem):
    """The rule of an arriving result (answers.arrived_result), decided here rather than in
    the shell: the operation took effect, but a result the log cannot store is never sent,
    so the model is told the outcome is unknown; an anomaly keeps the result's start."""
    log = _started()
    anomaly, checked, failed = _answer(log, Done(result))
    assert (anomaly.kind, anomaly.detail["type"]) == ("unstorable_event",
                                                      "tool.call_completed")
    assert problem in anomaly.detail["error"]
    assert (checked.answer, failed) == ("cannot_tell", ev.ToolCallFailed(
        "c1", OUTCOME_UNKNOWN, outcome_unknown=True))
    assert checked.detail.startswith("the check said done, with a result the log cannot "
                                     "store (") and problem in checked.detail
    c1 = log.state().calls["c1"]
    assert (c1.status, c1.outcome_unknown, c1.checked) == ("failed", True, "cannot_tell")


def test_what_is_no_answer_is_outcome_unknown():
    log = _started()
    assert _answer(log, NotAnAnswer("'yes'")) == [
        ev.ToolOutcomeChecked("c1", "cannot_tell",
                              "the check answered 'yes', not Done, NotDone or CannotTell"),
        ev.ToolCallFailed("c1", OUTCOME_UNKNOWN, outcome_unknown=True)]


def test_an_answer_for_a_call_no_longer_in_doubt_changes_nothing():
    log = _started()
    _answer(log, Done({"a": 1}))
    assert _answer(log, Done({"a": 2})) == []  # asked twice: the first answer stands
    assert answer_events(log.state(), "nope", Done(), CHECKED) == []
    running = _started(epoch_after=None)  # this worker's own call: not in doubt
    assert answer_events(running.state(), "c1", NotDone(), CHECKED) == []


def test_a_check_answers_one_of_three_things():
    with pytest.raises(TypeError, match="Done, NotDone or CannotTell"):
        answer_events(_started().state(), "c1", True, CHECKED)  # type: ignore[arg-type]


def test_the_new_fields_survive_a_snapshot():
    log = _started()
    _answer(log, NotDone(), RERUN)
    log.add(ev.SessionClosed("ended"), ev.ToolCallCompleted("c1", {"late": True}))
    s = log.state()
    back = from_snapshot(to_snapshot(s))
    assert back.calls["c1"].checked == "not_done" and back.calls["c1"].finished_after_end


def test_policy_names_checked_tools_as_a_set():
    with pytest.raises(ValueError, match="outcome_checks"):
        Policy(outcome_checks="refund")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rerun_if_not_done"):
        Policy(rerun_if_not_done="all")  # type: ignore[arg-type]
    assert Policy(outcome_checks=["refund"]).checks("refund")
