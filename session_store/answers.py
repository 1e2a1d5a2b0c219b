"""What a tool call is owed when pipecat's side of it ends (pure): a call stopped without a
result gets an explicit failure unless the server cancelled it; a result handed over again
after its own append failed is logged unless the log has one; an intermediate result is the
call's next part. `decide` rules on the observations that carry them (ToolStopped,
ResultReturned, ProgressReturned), on the state as it is when they are logged."""

from __future__ import annotations

from typing import Any

from . import events as ev
from .state import SessionState


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


def next_progress(state: SessionState, call_id: str, value: Any, scheduling: str | None
                  ) -> list[ev.Event]:
    """An intermediate result as the call's next part, unless the call has its outcome."""
    call = state.calls.get(call_id)
    if call is None or call.has_outcome:
        return []
    return [ev.ToolCallProgress(call_id, len(call.progress) + 1, value, scheduling)]
