"""The invariant checker itself: logs that break an invariant must be reported.

Each log here is right in every other respect (a complete, verified call whose results
reached the model), so the one violation is the only thing that can be reported."""

from __future__ import annotations

from rig.crash.invariants import check_call
from rig.crash.scenarios import SCENARIOS
from session_store import events as ev
from session_store.audit.verify import verify_log

SINGLE = SCENARIOS["single_call"]
ARGS = {"id": 42}


def _epoch(events) -> int:
    """The epoch a worker appends such a log with: the highest it records (a takeover's)."""
    return max(e.epoch for e in events if isinstance(e, (ev.SessionOpened, ev.WorkerAttached)))


async def _check(store, call_id, events, ledger):
    await store.append(call_id, events, 0, epoch=_epoch(events))
    records = await store.read(call_id)
    return check_call(SINGLE, records, await verify_log(store, call_id), None, ledger)


def _taken_over(outcome: ev.Event) -> list[ev.Event]:
    """Worker 1 starts lookup_order and dies inside it; worker 2 records `outcome` for it,
    and delivers it to a fresh session."""
    return [
        ev.SessionOpened("m", ["lookup_order"], "w1", 1),
        ev.Connected(1),
        ev.ToolCallRequested("c1", "lookup_order", ARGS, 1),
        ev.ToolCallStarted("c1", 1, "k:c1", 1),
        ev.WorkerAttached("w2", 2),
        ev.Connected(2),
        outcome,
        ev.ToolResultSending("c1", 2, "seed"),
        ev.ToolResultSent("c1", 2, "seed"),
        ev.SessionClosed(),
    ]


RAN_ONCE = [{"tool": "lookup_order", "call_id": "c1", "args": ARGS, "idempotency_key": "k:c1"}]


async def test_an_in_doubt_call_answered_outcome_unknown_passes(store):
    failed = ev.ToolCallFailed("c1", "outcome unknown", outcome_unknown=True)
    assert await _check(store, "in-doubt-ok", _taken_over(failed), RAN_ONCE) == []


async def test_an_in_doubt_call_answered_with_a_made_up_success_is_reported(store):
    """I3: a non-idempotent call found in doubt gets an explicit "outcome unknown". The new
    worker did not run it, so a success it logs was made up (the dead worker's run may have
    failed), and the model acts on it. (Mutant: ResolveInDoubt logging a completion passed
    every boundary of the crash suite.)"""
    made_up = ev.ToolCallCompleted("c1", {"ok": True})
    problems = await _check(store, "in-doubt-made-up", _taken_over(made_up), RAN_ONCE)
    assert any(p.startswith("I3:") and "c1" in p for p in problems), problems


async def test_a_run_without_its_start_in_the_log_is_reported(store):
    """Write-ahead (I3): every run of a tool has its own `tool.call_started` in the log. An
    idempotent tool run ahead of its start's commit, by a worker that died in that commit,
    and run again (same key) by the next worker, left two runs and one start; the ledger
    check let it pass (one key). (Mutant: running the calls before committing their start.)"""
    scenario = SCENARIOS["idempotent_tool"]
    call_id = "run-ahead"
    await store.append(call_id, [
        ev.SessionOpened("m", ["send_receipt"], "w1", 1),
        ev.Connected(1),
        ev.ToolCallRequested("c1", "send_receipt", ARGS, 1),
        ev.WorkerAttached("w2", 2),
        ev.Connected(2),
        ev.ToolCallStarted("c1", 1, "k:c1", 2),
        ev.ToolCallCompleted("c1", {"ok": True}),
        ev.ToolResultSending("c1", 2, "seed"),
        ev.ToolResultSent("c1", 2, "seed"),
        ev.SessionClosed(),
    ], 0, epoch=1)
    run = {"tool": "send_receipt", "call_id": "c1", "args": ARGS, "idempotency_key": "k:c1"}
    records = await store.read(call_id)
    problems = check_call(scenario, records, await verify_log(store, call_id), None, [run, run])
    assert any(p.startswith("I3:") and "c1" in p for p in problems), problems


async def test_a_call_the_model_still_waits_for_at_the_end_is_reported(store):
    """I1 as the model sees it: the last session asked for lookup_order again (the seed,
    with the first answer, reached it after it asked) and nobody answered that id. The log
    never recorded the call, and the model holds a lookup_order result, so checking by
    name passed (mutant: a repeat of an answered call dropped unlogged), while the model
    waited for ever."""
    from types import SimpleNamespace

    from service.local_live import Connection, ToolResult

    first, last = Connection(0, "/ws", 0.0, setup={}), Connection(1, "/ws", 1.0, setup={})
    last.state.issued["lookup_order-2"] = "lookup_order"
    last.state.history_results.append(ToolResult(1, None, "lookup_order", {"ok": True},
                                                 "content", True, 1, 1.0))
    server = SimpleNamespace(violations=[], errors=[], connections=[first, last])
    events = _taken_over(ev.ToolCallFailed("c1", "outcome unknown", outcome_unknown=True))
    await store.append("still-waiting", events, 0, epoch=_epoch(events))
    records = await store.read("still-waiting")
    problems = check_call(SINGLE, records, await verify_log(store, "still-waiting"), server,
                          RAN_ONCE)
    assert problems == ["I1: the model still waits for lookup_order-2 (lookup_order) on the "
                        "last connection"], problems


async def test_a_result_without_its_run_in_the_ledger_is_reported(store):
    """I3 is checked on the ledger the tools write: a ledger missing runs (not written, or
    written elsewhere) made every I3 check pass by default. A result the worker that ran the
    call logged has its run in the ledger, written before the tool returned."""
    events = [
        ev.SessionOpened("m", ["lookup_order"], "w1", 1),
        ev.Connected(1),
        ev.ToolCallRequested("c1", "lookup_order", ARGS, 1),
        ev.ToolCallStarted("c1", 1, "k:c1", 1),
        ev.ToolCallCompleted("c1", {"ok": True}),
        ev.ToolResultSending("c1", 1, "tool_response"),
        ev.ToolResultSent("c1", 1, "tool_response"),
        ev.SessionClosed(),
    ]
    assert await _check(store, "ran-once", events, RAN_ONCE) == []
    problems = check_call(SINGLE, await store.read("ran-once"),
                          await verify_log(store, "ran-once"), None, [])
    assert any(p.startswith("I3:") and "c1" in p and "ledger" in p for p in problems), problems


async def test_sessions_the_server_never_saw_are_reported(store):
    """The server's record is the model's side of I1 and I2: sessions the log says were
    connected but the server never saw (none at all here: the worker talked to something
    else) were checked against nothing, and passed."""
    from types import SimpleNamespace

    server = SimpleNamespace(violations=[], errors=[], connections=[])
    events = _taken_over(ev.ToolCallFailed("c1", "outcome unknown", outcome_unknown=True))
    await store.append("unseen", events, 0, epoch=_epoch(events))
    problems = check_call(SINGLE, await store.read("unseen"), await verify_log(store, "unseen"),
                          server, RAN_ONCE)
    assert problems == ["server: the log has 2 connected sessions, the server saw 0"], problems
