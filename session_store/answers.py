"""What a tool call is owed when pipecat's side of it ends (pure): a call stopped without a
result gets an explicit failure unless the server cancelled it; a result handed over again
after its own append failed is logged unless the log has one; an intermediate result is the
call's next part. `decide` rules on the observations that carry them (ToolStopped,
ResultReturned, ProgressReturned), on the state as it is when they are logged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import events as ev
from .state import SessionState
from .storable import Unstorable, clean, unstorable_anomaly, why_unstorable


def cancelled_on_wire(state: SessionState, call_id: str, wire_ids) -> bool:
    """Did the server cancel this call (its id among `wire_ids`, the ids its
    toolCallCancellations named as they came off the wire, logged or not yet), or an id that
    re-asked for it (`superseded_by`, transitively)?"""
    return bool(wire_ids_naming(state, call_id, wire_ids))


def wire_ids_naming(state: SessionState, call_id: str, wire_ids) -> list[str]:
    """The ids among `wire_ids` that name this call or an id that re-asked for it: all a
    ToolStopped decision reads of them (so all its logged observation keeps)."""
    named: list[str] = []
    seen: set[str] = set()
    current: str | None = call_id
    while current and current not in seen:
        if current in wire_ids:
            named.append(current)
        seen.add(current)
        call = state.calls.get(current)
        current = call.superseded_by if call is not None else None
    return named


#: The answer for a call pipecat stopped before it returned (its timeout, or the app).
STOPPED_ERROR = ("stopped before it returned a result (it ran past its timeout, or the "
                 "application cancelled it); it may or may not have taken effect. Check "
                 "before retrying.")


def stopped_failure(state: SessionState, call_id: str, wire_ids) -> list[ev.Event]:
    """A running call stopped without a result: the model still waits for an answer, so it
    gets an explicit failure, unless the server cancelled it (nothing is owed) or it is not
    running (it has its outcome already). Decided when logged, after whatever was noted
    before it (a cancellation noted while the log was busy)."""
    call = state.calls.get(call_id)
    if call is None or call.status != "started" or cancelled_on_wire(state, call_id, wire_ids):
        return []
    return [ev.ToolCallFailed(call_id, STOPPED_ERROR, outcome_unknown=True)]


def unless_answered(state: SessionState, call_id: str, outcome: list[ev.Event]
                    ) -> list[ev.Event]:
    """A tool's outcome, unless the call already has one (an append of it that failed may
    have committed after all: the state re-read from the log shows it)."""
    call = state.calls.get(call_id)
    return [] if call is None or call.has_outcome else list(outcome)


def arrived_result(state: SessionState, call_id: str, name: str | None, value: Any,
                   run_llm: bool = True, again: bool = False) -> list[ev.Event]:
    """A tool's final result: the call's outcome. A result for no call the log knows, or
    for a call that has its outcome, is an anomaly, unless it is handed over `again` (the
    append that failed may have committed after all: then it is nothing). A value the log
    cannot store (NaN, a lone surrogate, a cycle) answers the call as failed, with an
    anomaly holding its start: logged as it was, it failed its append and every retry of
    it, and the model never got an answer (seen)."""
    call = state.calls.get(call_id)
    if call is None or call.has_outcome:
        if again:
            return []
        kind = "result_for_unknown_call" if call is None else "second_result"
        return [ev.AnomalyRecorded(kind, {"call_id": clean(call_id), "name": _name(
            call.name if call is not None else name)}, state.generation)]
    scheduling = (("WHEN_IDLE" if run_llm else "SILENT") if call.mode == "non_blocking"
                  else None)
    problem = unstorable(value, lambda: ev.ToolCallCompleted(call_id, value,
                                                             scheduling=scheduling))
    if problem is None:
        return [ev.ToolCallCompleted(call_id, value, scheduling=scheduling)]
    return [_unstorable(ev.ToolCallCompleted.TYPE, call_id, value, problem, state),
            ev.ToolCallFailed(call_id, f"the tool's result cannot be stored in the call's "
                                       f"log ({problem}), so it was not sent")]


def next_progress(state: SessionState, call_id: str, value: Any, scheduling: str | None,
                  name: str | None = None) -> list[ev.Event]:
    """An intermediate result as the NON_BLOCKING call's next part. A blocking call takes
    one result (the model waits for it), a call with its outcome takes no more, and one the
    log does not know takes nothing: the intermediate result is logged as dropped, never
    dropped silently; so is one the log cannot store."""
    call = state.calls.get(call_id)
    if call is None or call.mode != "non_blocking" or call.has_outcome:
        why = ("no such call" if call is None else "the call already has its outcome"
               if call.has_outcome else "the call is blocking: the model takes one result")
        return [ev.AnomalyRecorded("intermediate_result_dropped", {
            "call_id": clean(call_id), "name": _name(name), "why": why}, state.generation)]
    part = len(call.progress) + 1
    problem = unstorable(value, lambda: ev.ToolCallProgress(call_id, part, value, scheduling))
    if problem is not None:
        return [_unstorable(ev.ToolCallProgress.TYPE, call_id, value, problem, state)]
    return [ev.ToolCallProgress(call_id, part, value, scheduling)]


def unstorable(value: Any, event: Callable[[], ev.Event]) -> str | None:
    """Why the event `event()` makes of a tool's `value` cannot be stored (None: it can)."""
    return value.problem if isinstance(value, Unstorable) else why_unstorable(event())


def _unstorable(etype: str, call_id: str, value: Any, problem: str,
                state: SessionState) -> ev.AnomalyRecorded:
    start = value.start if isinstance(value, Unstorable) else value
    return unstorable_anomaly(etype, {"call_id": call_id, "result": start}, problem,
                              state.generation)


def _name(name: Any) -> str | None:
    return clean(name) if isinstance(name, str) else None
