"""A tool call at the edges of a call, through the real pipeline, the real google-genai client
and the local server, on SQLite and PostgreSQL (issue #32, items 3 and 8).

- The caller hangs up while a tool runs: the call ends at once (session.closed), the tool
  goes on for up to `tool_grace_s` and its outcome is logged after the end; one that takes
  longer is in doubt. A closed call's state never says `running`.
- A worker takes over a call whose tool a crash left in doubt: the tool's outcome check is
  asked by the idempotency key, and the model gets the real result (done), an explicit
  "not done" (or the tool runs again with the same key, where that is safe), and "outcome
  unknown" only when the check cannot tell, fails or times out.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from service.gemini_live import CannotTell, Done, NotDone
from service.local_live import Audio, Call, Script, ToolCall, TurnComplete
from session_store.audit.replay import logged_decisions, replay
from session_store.delivery import OUTCOME_UNKNOWN
from session_store.policy import Policy
from session_store.outcomes import NOT_DONE_ERROR

from .helpers import (Ctl, assert_answered_once, assert_chain_ok, assert_log_settled,
                      assert_ran_once, assert_server_clean, run_call)
from .test_takeover_seed import ORDER, dead_workers_log

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.generations("2.5", reason="the hang-up and the takeover are the "
                                                    "log's: one generation is enough")]


def _durable(flavour) -> None:
    if not flavour.durable:
        pytest.skip("what a call's log says after its end is ours")


def _hang_up_script() -> Script:
    return Script([ToolCall(Call("c1", ORDER, {"id": 7})), TurnComplete()], reply=())


async def _hang_up_while_the_tool_runs(ctl: Ctl) -> None:
    assert await ctl.wait(lambda: ctl.ledger.runs, timeout=10), "the tool never started"
    ctl.mark("hang_up")  # the pipeline ends now (EndFrame), as on a Twilio `stop`


async def test_a_tool_running_at_the_hang_up_logs_its_outcome_after_the_end(flavour):
    _durable(flavour)
    run = await run_call(flavour, _hang_up_script(), _hang_up_while_the_tool_runs,
                         tool_delay=1.0, end_timeout=8.0)

    assert_ran_once(run, "c1")
    closed = run.at("session.closed")
    assert closed < run.at("tool.call_completed", call_id="c1"), run.timeline()
    c1 = run.state.calls["c1"]
    assert (c1.status, c1.finished_after_end) == ("completed", True)
    assert c1.result == {"ok": True, "tool": ORDER, "args": {"id": 7}}
    assert run.state.running() == [] and run.state.in_doubt() == []
    # Nobody is on the call: the result is logged, never sent.
    assert run.results() == [] and not run.find("tool.result_sending")
    assert_server_clean(run)
    await assert_chain_ok(run)


async def test_a_tool_still_running_after_the_grace_is_in_doubt_never_running(flavour):
    _durable(flavour)
    began = time.monotonic()
    run = await run_call(flavour, _hang_up_script(), _hang_up_while_the_tool_runs,
                         tool_delay=30.0, end_timeout=8.0, tool_grace_s=0.5)
    assert time.monotonic() - began < 20, "the end of the call waited for the tool"

    assert_ran_once(run, "c1")
    assert run.types()[-1] == "session.closed", run.timeline()
    s = run.state
    assert s.closed and s.calls["c1"].status == "started"
    assert s.running() == [] and [c.call_id for c in s.in_doubt()] == ["c1"]
    await assert_chain_ok(run)


# --------------------------------------------------------------------------- outcome checks

REFUND = {"order_id": 48213, "refunded": True, "amount": "59.90 EUR"}
CYCLE: dict = {"order_id": 48213}
CYCLE["self"] = CYCLE


class Check:
    """An outcome check that records what it was asked."""

    def __init__(self, answer, *, delay: float = 0.0):
        self.answer, self.delay = answer, delay
        self.asked: list[tuple[str, dict]] = []

    async def __call__(self, key: str, args: dict):
        self.asked.append((key, args))
        await asyncio.sleep(self.delay)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def _take_over_with(flavour, check: Check, setup_delay: float = 0.0, anomalies: int = 0,
                          **options):
    call_id = f"call-{uuid.uuid4().hex[:10]}"
    await dead_workers_log(flavour.store, call_id, completed=False, model=flavour.model)

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: ctl.llm._session is not None, timeout=15)
        await ctl.run_llm()
        assert await ctl.wait(lambda: ctl.results("c1") and not ctl.tap.speaking
                              and ctl.script_done(0), timeout=15)
        await ctl.settle()

    run = await run_call(flavour, Script([], reply=(Audio(chunks=2), TurnComplete()),
                                         setup_delay=setup_delay), drive,
                         call_id=call_id, run_first=False,
                         prepare=lambda llm: llm.register_outcome_check(ORDER, check, **options))
    assert check.asked == [(f"{call_id}:c1", {"id": 48213})], "the check was not asked once"
    assert_server_clean(run)
    assert_log_settled(run, anomalies=anomalies)
    await assert_chain_ok(run)
    # `session-store replay` decides as the log did, with the policy the call ran with (the
    # check's answer is a decision: "not done" is re-run only where the tool allows it).
    rerun = frozenset({ORDER}) if options.get("rerun_if_not_done") else frozenset()
    report = replay(run.events, Policy(rerun_if_not_done=rerun), call_id=call_id)
    assert report.ok, [d.message for d in report.divergences] or report.error
    n = len(list(logged_decisions(run.events)))
    assert report.coverage == f"{n} of {n} decisions replayed", report.coverage
    return run


async def test_a_check_that_knows_it_was_done_gives_the_model_the_real_result(flavour):
    _durable(flavour)
    run = await _take_over_with(flavour, Check(Done(REFUND)))
    assert run.runs() == [], "the tool ran again"
    assert assert_answered_once(run, "c1", ORDER).response == REFUND
    assert [e.data["answer"] for e in run.find("tool.outcome_checked")] == ["done"]
    checked, completed = run.at("tool.outcome_checked"), run.at("tool.call_completed")
    assert checked + 1 == completed < run.at("connection.connected", generation=2), (
        run.timeline())
    assert not run.state.calls["c1"].outcome_unknown


async def test_a_check_that_knows_it_was_not_done_says_so_and_runs_nothing(flavour):
    _durable(flavour)
    run = await _take_over_with(flavour, Check(NotDone()))
    assert run.runs() == []
    response = assert_answered_once(run, "c1", ORDER).response
    assert response == {"error": NOT_DONE_ERROR, "outcome_unknown": False}


async def test_not_done_runs_again_with_the_same_key_where_the_tool_allows(flavour):
    _durable(flavour)
    run = await _take_over_with(flavour, Check(NotDone()), rerun_if_not_done=True)
    again = assert_ran_once(run, "c1")
    assert again["idempotency_key"] == f"{run.call_id}:c1"
    assert [e.data["attempt"] for e in run.find("tool.call_started")] == [1, 2]
    assert assert_answered_once(run, "c1", ORDER).response["ok"] is True


async def test_a_takeovers_rerun_does_not_wait_for_the_gemini_handshake(flavour):
    # The model waits for the result: a re-run started only once the session was up (as
    # before) made the caller's silence after a crash longer by the whole handshake.
    _durable(flavour)
    run = await _take_over_with(flavour, Check(NotDone()), setup_delay=1.0,
                                rerun_if_not_done=True)
    assert_ran_once(run, "c1")
    assert run.at("tool.call_started", attempt=2) < run.at("connection.connected",
                                                           generation=2), run.timeline()
    assert assert_answered_once(run, "c1", ORDER).response["ok"] is True


@pytest.mark.parametrize("answer,delay,detail,anomalies", [
    (CannotTell("the ledger is unreachable"), 0.0, "the ledger is unreachable", 0),
    (RuntimeError("503 from the refunds API"), 0.0, "RuntimeError: 503 from the refunds API", 0),
    (Done(REFUND), 3.0, "did not answer within 0.5 s", 0),
    ("yes", 0.0, "the check answered 'yes', not Done, NotDone or CannotTell", 0),
    # Judged on the log (outcomes.answer_events), not in the shell: replay decides it again,
    # and an anomaly keeps the start of the result (as for a tool's own result).
    (Done({**REFUND, "amount": float("nan")}), 0.0, "a result the log cannot store", 1),
    (Done(CYCLE), 0.0, "a result the log cannot store (ValueError: Circular reference", 1),
], ids=["cannot_tell", "raises", "times_out", "no_answer", "unstorable", "not_json"])
async def test_outcome_unknown_only_when_the_check_cannot_tell(flavour, answer, delay, detail,
                                                               anomalies):
    _durable(flavour)
    run = await _take_over_with(flavour, Check(answer, delay=delay), rerun_if_not_done=True,
                                timeout_s=0.5, anomalies=anomalies)
    assert run.runs() == []
    response = assert_answered_once(run, "c1", ORDER).response
    assert response == {"error": OUTCOME_UNKNOWN, "outcome_unknown": True}
    (checked,) = run.find("tool.outcome_checked")
    assert checked.data["answer"] == "cannot_tell" and detail in checked.data["detail"]
    observed = [e for e in run.events if e.type == "decision.observed"
                and e.data["kind"] == "OutcomeAnswered"]
    assert len(observed) == 1  # the answer as it came is logged, and replayed


async def test_register_outcome_check_refuses_what_it_cannot_use(flavour):
    _durable(flavour)
    seen: list[Exception] = []

    def prepare(llm):
        for bad in (dict(name="", check=Check(NotDone())),
                    dict(name=ORDER, check="not callable"),
                    dict(name=ORDER, check=Check(NotDone()), rerun_if_not_done="yes"),
                    dict(name=ORDER, check=Check(NotDone()), timeout_s=-1)):
            with pytest.raises((TypeError, ValueError)) as info:
                llm.register_outcome_check(**bad)
            seen.append(info.value)
        assert not llm.driver.policy.outcome_checks

    async def drive(ctl: Ctl):
        return None

    await run_call(flavour, Script([]), drive, run_first=False, prepare=prepare)
    assert len(seen) == 4
