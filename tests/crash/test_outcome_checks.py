"""Outcome checks across real crashes (issue #32, item 8), and the checker's I8.

A worker running `refund_order` (not idempotent) is SIGKILLed before its side effect (right
after its start is logged) or after it (inside the tool, the ledger line written); a new
process takes the call over on the same database, SQLite or PostgreSQL. The tool's check
asks the ledger by the idempotency key: the model gets the real result when it ran, the
refund runs again (same key, once in all) when it did not, and "outcome unknown" only where
the check cannot tell (`unsure_refund`). I8 checks the log against the check and the ledger.
"""

from __future__ import annotations

import json

import pytest

from rig.crash.case import Kill, run_case
from rig.crash.harness import Databases
from rig.crash.invariants import check_call
from rig.crash.scenarios import SCENARIOS
from session_store import events as ev
from session_store import open_store
from session_store.audit.verify import verify_log

pytestmark = pytest.mark.timeout(180)

REFUND = "refund_order"
BEFORE = Kill(after_event="tool.call_started")  # its start is logged, the tool never ran
AFTER = Kill(in_tool=REFUND)  # the ledger line (the refund) is written, no outcome logged


@pytest.fixture(params=["sqlite", "postgres"])
async def databases(request, tmp_path):
    dbs = Databases(request.param, tmp_path)
    yield dbs
    await dbs.cleanup()


async def _case(databases, tmp_path, scenario: str, kill: Kill):
    url, schema = await databases()
    result = await run_case(scenario, url, schema=schema, kills=[kill], workdir=tmp_path)
    assert result.ok, result.violations
    assert result.kills == 1 and result.workers == 2, result
    store = await open_store(url, **({"schema": schema} if schema else {}))
    try:
        records = await store.read(result.call_id)
    finally:
        await store.close()
    ledger_path = tmp_path / f"{result.call_id}.ledger.jsonl"
    ledger = [json.loads(line) for line in ledger_path.read_text().splitlines()] \
        if ledger_path.exists() else []
    return records, ledger


def _of(records, etype: str) -> list[dict]:
    return [r.data for r in records if r.type == etype]


async def test_killed_after_the_refund_the_model_gets_the_real_result(databases, tmp_path):
    records, ledger = await _case(databases, tmp_path, "checked_refund", AFTER)
    assert [e["tool"] for e in ledger] == [REFUND], "the refund ran again"
    assert [c["answer"] for c in _of(records, "tool.outcome_checked")] == ["done"]
    (completed,) = _of(records, "tool.call_completed")
    assert completed["result"]["ok"] is True and completed["result"]["args"] == {"id": 42}
    assert not [f for f in _of(records, "tool.call_failed") if f.get("outcome_unknown")]


async def test_killed_before_the_refund_it_runs_once_with_its_key(databases, tmp_path):
    records, ledger = await _case(databases, tmp_path, "checked_refund", BEFORE)
    assert [e["tool"] for e in ledger] == [REFUND], "the refund ran twice, or never"
    assert [c["answer"] for c in _of(records, "tool.outcome_checked")] == ["not_done"]
    starts = _of(records, "tool.call_started")
    assert [s["attempt"] for s in starts] == [1, 2]
    assert starts[0]["idempotency_key"] == starts[1]["idempotency_key"] == \
        ledger[0]["idempotency_key"]
    assert not _of(records, "tool.call_failed")


async def test_a_check_that_cannot_tell_is_the_only_outcome_unknown(databases, tmp_path):
    records, ledger = await _case(databases, tmp_path, "unsure_refund", AFTER)
    assert [e["tool"] for e in ledger] == [REFUND]
    (checked,) = _of(records, "tool.outcome_checked")
    assert checked["answer"] == "cannot_tell"
    (failed,) = _of(records, "tool.call_failed")
    assert failed["outcome_unknown"] is True


# --------------------------------------------------------------------------- the checker

CHECKED = SCENARIOS["checked_refund"]
ARGS = {"id": 42}
RAN = [{"tool": REFUND, "call_id": "c1", "args": ARGS, "idempotency_key": "k:c1", "at": 0}]


def _taken_over(*answer: ev.Event) -> list[ev.Event]:
    return [ev.SessionOpened("m", [REFUND], "w1", 1), ev.Connected(1),
            ev.ToolCallRequested("c1", REFUND, ARGS, 1), ev.ToolCallStarted("c1", 1, "k:c1", 1),
            ev.WorkerAttached("w2", 2), *answer, ev.Connected(2),
            ev.ToolResultSending("c1", 2, "seed"), ev.ToolResultSent("c1", 2, "seed"),
            ev.SessionClosed()]


async def _problems(store, call_id: str, events: list[ev.Event], ledger) -> list[str]:
    # appended as the worker that took over would: with its epoch (a lower head fails verify)
    await store.append(call_id, events, 0, epoch=2)
    records = await store.read(call_id)
    return check_call(CHECKED, records, await verify_log(store, call_id), None, ledger)


UNKNOWN = ev.ToolCallFailed("c1", "outcome unknown", outcome_unknown=True)


async def test_the_checker_passes_a_checked_answer(store):
    done = [ev.ToolOutcomeChecked("c1", "done"), ev.ToolCallCompleted("c1", {"ok": True})]
    assert await _problems(store, "i8-ok", _taken_over(*done), RAN) == []
    unsure = [ev.ToolOutcomeChecked("c1", "cannot_tell", "down"), UNKNOWN]
    assert await _problems(store, "i8-unsure", _taken_over(*unsure), RAN) == []


async def test_the_checker_reports_unknown_where_the_check_knew(store):
    """I8. (Mutant: answer_events logging "outcome unknown" after a "done".)"""
    knew = [ev.ToolOutcomeChecked("c1", "done"), UNKNOWN]
    problems = await _problems(store, "i8-knew", _taken_over(*knew), RAN)
    assert any(p.startswith("I8:") and "said done" in p for p in problems), problems
    never_asked = await _problems(store, "i8-never", _taken_over(UNKNOWN), RAN)
    assert any(p.startswith("I8:") and "without asking" in p for p in never_asked), never_asked


async def test_the_checker_reports_a_check_that_contradicts_the_ledger(store):
    done = [ev.ToolOutcomeChecked("c1", "done"), ev.ToolCallCompleted("c1", {"ok": True})]
    problems = await _problems(store, "i8-lied", _taken_over(*done), [])
    assert any(p.startswith("I8:") and "no run" in p for p in problems), problems
