"""The durable service's decisions in the call's OpenTelemetry trace, when pipecat traces it.

With `PipelineWorker(..., enable_tracing=True, conversation_id=call_id)` pipecat traces a
conversation span and a span per turn; the service then adds one short span per decision
its log records, as a child of the turn (or of the conversation between turns), each with
`conversation.id` = the call id (pipecat's attribute), so a search on it finds both workers
of a crash and its recovery:

- `durable.call_opened` / `durable.takeover` (epoch, worker, version taken over at, the
  tool calls it found in doubt);
- `durable.tool_deferred`, `durable.tool_run` (attempt, `durable.idempotency_key`, rerun),
  `durable.tool_outcome_unknown`;
- `durable.reconnect` (why, the settings it carries), `durable.session` (generation,
  resumed or fresh), `durable.result_resent` (a result sent again on a later session),
  `durable.context_update`, `durable.anomaly` (kind), `durable.call_left` (ended,
  taken_over, stopped).

Off by default: without pipecat's tracing the service registers nothing here, and a commit
pays what it pays with no observer (service/observe.py). Decisions logged before the
conversation span exists (a takeover is logged in setup(), before the StartFrame) are
emitted, with their own times, as soon as it does.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from session_store import events as ev

from . import observe
from .driver import CallDriver

__all__ = ["TRACER_NAME", "follow"]

TRACER_NAME = "gemini_durable"
CONVERSATION_ID = "conversation.id"  # pipecat's attribute (turn_trace_observer.py)


@dataclass
class _Call:
    tracing_context: Any  # pipecat's TracingContext of the call's pipeline
    pending: list[tuple[str, dict[str, Any], int]] = field(default_factory=list)
    parent: Any = None  # the last context found: the conversation's may be gone at the end


class DecisionTracer:
    """The service sink (observe.Sink) that turns committed decisions into spans."""

    def __init__(self) -> None:
        self._calls: weakref.WeakKeyDictionary[CallDriver, _Call] = \
            weakref.WeakKeyDictionary()

    def follow(self, driver: CallDriver, tracing_context: Any) -> None:
        self._calls[driver] = _Call(tracing_context)

    def committed(self, driver: CallDriver, events: Sequence[ev.Event]) -> None:
        call = self._calls.get(driver)
        if call is None:
            return
        for e in events:
            found = _span_of(driver, e)
            if found is not None:
                call.pending.append((*found, time.time_ns()))
        self._flush(driver, call, force=False)

    def left(self, driver: CallDriver, why: str) -> None:
        call = self._calls.pop(driver, None)
        if call is not None:
            why = "ended" if driver.state.closed and not driver.fenced else why
            call.pending.append(("durable.call_left", {"durable.reason": why}, time.time_ns()))
            self._flush(driver, call, force=True)
        if not self._calls:  # no traced call left: commits go back to paying nothing
            observe.remove(self)

    def _flush(self, driver: CallDriver, call: _Call, force: bool) -> None:
        ctx = call.tracing_context
        call.parent = ctx.get_turn_context() or ctx.get_conversation_context() or call.parent
        parent = call.parent
        if parent is None and not force:
            return  # before the conversation span: held until it exists
        tracer = trace.get_tracer(TRACER_NAME)
        for name, attributes, at in call.pending:
            span = tracer.start_span(name, context=parent, start_time=at, attributes={
                CONVERSATION_ID: driver.call_id, "durable.epoch": driver.epoch,
                **attributes})
            span.end(end_time=at)
        call.pending.clear()


def _span_of(driver: CallDriver, e: ev.Event) -> tuple[str, dict[str, Any]] | None:
    """The span a committed event makes (name, attributes), or None."""
    state = driver.state
    match e:
        case ev.SessionOpened():
            return "durable.call_opened", {"durable.worker": e.worker,
                                           "durable.model": e.model}
        case ev.WorkerAttached():
            in_doubt = sorted(c.call_id for c in state.calls.values() if c.status == "started")
            return "durable.takeover", {
                "durable.worker": e.worker, "durable.takeover_epoch": e.epoch,
                "durable.reason": e.reason, "durable.version": state.version,
                "durable.in_doubt": in_doubt}
        case ev.ToolCallDeferred():
            return "durable.tool_deferred", _tool(state, e.call_id)
        case ev.ToolCallStarted():
            return "durable.tool_run", {
                **_tool(state, e.call_id), "durable.attempt": e.attempt,
                "durable.idempotency_key": e.idempotency_key, "durable.rerun": e.attempt > 1}
        case ev.ToolCallFailed(outcome_unknown=True):
            return "durable.tool_outcome_unknown", _tool(state, e.call_id)
        case ev.ReconnectRequested():
            return "durable.reconnect", {"durable.reason": e.reason,
                                         "durable.settings": list(e.keys)}
        case ev.Connected():
            return "durable.session", {"durable.generation": e.generation,
                                       "durable.resumed": e.handle is not None}
        case ev.ToolResultSending():
            call = state.calls.get(e.call_id)
            if call is not None and any(s.generation < e.generation
                                        for s in call.sends_of(e.part)):
                return "durable.result_resent", {
                    **_tool(state, e.call_id), "durable.generation": e.generation,
                    "durable.via": e.via, "durable.part": e.part}
            return None
        case ev.ContextSent():
            return "durable.context_update", {"durable.generation": e.generation}
        case ev.AnomalyRecorded():
            return "durable.anomaly", {"durable.kind": e.kind}
    return None


def _tool(state, call_id: str) -> dict[str, Any]:
    call = state.calls.get(call_id)
    return {"gen_ai.tool.call.id": call_id,
            **({"gen_ai.tool.name": call.name} if call is not None else {})}


_TRACER = DecisionTracer()


def follow(driver: CallDriver, tracing_context: Any) -> None:
    """Trace `driver`'s call into pipecat's `tracing_context` (FrameProcessorSetup's; None
    when the pipeline does not trace: then nothing is registered and nothing is paid)."""
    if tracing_context is None:
        return
    observe.add(_TRACER)
    _TRACER.follow(driver, tracing_context)
