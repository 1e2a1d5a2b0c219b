"""Prometheus metrics of the durable service, for any host application: one call.

    from service import metrics
    metrics.install()          # before the first call; prometheus_client's default registry
    # then serve prometheus_client.generate_latest() at /metrics, or
    # prometheus_client.start_http_server(9100)

Every figure is read from what the call's log stored (service/observe.py) or from the
store's commits (session_store/storage/observers.py): a re-run is a `tool.call_started` of
attempt 2 or more, a takeover a `worker.attached`, so the metrics say what the log says.
Labels are few and bounded; never a call id. The names, what each counts and the alerts on
them: docs/metrics.md.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from session_store import events as ev
from session_store.errors import Fenced
from session_store.storage import observers

from . import observe
from .driver import CallDriver

__all__ = ["PREFIX", "DurableMetrics", "install", "installed", "uninstall"]

PREFIX = "gemini_durable"

#: How often the event-loop probe wakes: the lag is how late it wakes.
LOOP_PROBE_INTERVAL_S = 0.25

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            10.0, 30.0)
_LAG = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_EVENTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)

#: Why a call stopped being served by this worker (the `reason` label of calls_ended).
ENDED_REASONS = ("ended", "taken_over", "stopped")


class DurableMetrics:
    """The metrics, registered in one registry, and the sinks that feed them."""

    def __init__(self, registry: CollectorRegistry):
        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=registry)

        self.registry = registry
        self.live_calls = Gauge(f"{PREFIX}_live_calls", "Calls this worker serves now.",
                                registry=registry)
        self.calls_started = counter("calls_started", "Calls opened by this worker.")
        self.calls_ended = counter(
            "calls_ended", "Calls this worker stopped serving, by reason: ended (its end "
            "logged), taken_over (another worker fenced this one out), stopped (the pipeline "
            "stopped with the call open).", ["reason"])
        self.calls_taken_over = counter(
            "calls_taken_over", "Calls this worker took over from another (a new fencing "
            "epoch).")
        self.tool_calls_deferred = counter(
            "tool_calls_deferred", "Tool calls held until the bot stopped speaking.")
        self.tool_calls_run = counter("tool_calls_run", "Tool calls run the first time.")
        self.tool_calls_rerun = counter(
            "tool_calls_rerun", "Tool calls a crash left in doubt, run again with the same "
            "idempotency key.")
        self.tool_calls_unknown_outcome = counter(
            "tool_calls_unknown_outcome", "Tool calls a crash left in doubt, answered "
            "'outcome unknown' (their tool is not idempotent).")
        self.results_resent = counter(
            "results_resent", "Tool results sent again on a later session (after a "
            "reconnect or a takeover), because the earlier send may not have reached it.")
        self.prompt_changes = counter(
            "prompt_changes", "Prompt or tool changes applied, by how: context_update (in "
            "the live session) or reconnect (a new session).", ["how"])
        self.handshake_failures = counter(
            "handshake_failures", "Gemini Live connections that failed before setupComplete.")
        self.connections_given_up = counter(
            "connections_given_up", "Calls whose Gemini Live connection was given up after "
            "failures in a row.")
        self.fencing_refusals = counter(
            "fencing_refusals", "Appends refused because a newer worker owns the call.")
        self.append_seconds = Histogram(
            f"{PREFIX}_append_seconds", "Time an append to the log took, queueing included.",
            buckets=_SECONDS, registry=registry)
        self.commit_batch_events = Histogram(
            f"{PREFIX}_commit_batch_events", "Events stored by one database commit (group "
            "commit shares one between appends).", buckets=_EVENTS, registry=registry)
        self.event_loop_lag = Histogram(
            f"{PREFIX}_event_loop_lag_seconds", "How late the event loop ran a timer: what "
            "every call on this worker waited.", buckets=_LAG, registry=registry)
        for reason in ENDED_REASONS:  # every series exists from the start, at 0
            self.calls_ended.labels(reason)
        for how in ("context_update", "reconnect"):
            self.prompt_changes.labels(how)
        self._live: weakref.WeakSet[CallDriver] = weakref.WeakSet()
        self.live_calls.set_function(lambda: len(self._live))
        self._probes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task] = \
            weakref.WeakKeyDictionary()
        self._on: dict[type, Callable[[CallDriver, Any], None]] = {
            ev.SessionOpened: self._opened, ev.WorkerAttached: self._attached,
            ev.SessionClosed: lambda d, e: self.left(d, "ended"),
            ev.ToolCallDeferred: lambda d, e: self.tool_calls_deferred.inc(),
            ev.ToolCallStarted: self._started, ev.ToolCallFailed: self._failed,
            ev.ToolResultSending: self._sending,
            ev.ContextSent: lambda d, e: self.prompt_changes.labels("context_update").inc(),
            ev.ReconnectRequested: self._reconnect, ev.AnomalyRecorded: self._anomaly,
        }

    def collectors(self) -> list[Counter | Gauge | Histogram]:
        return [v for v in vars(self).values() if isinstance(v, (Counter, Gauge, Histogram))]

    # ------------------------------------------------------------------ service sink
    def committed(self, driver: CallDriver, events: Sequence[ev.Event]) -> None:
        on = self._on
        for e in events:
            handler = on.get(type(e))
            if handler is not None:
                handler(driver, e)

    def left(self, driver: CallDriver, why: str) -> None:
        if driver in self._live:
            self._live.discard(driver)
            self.calls_ended.labels(why).inc()

    def _opened(self, driver: CallDriver, _: ev.SessionOpened) -> None:
        self.calls_started.inc()
        self._serving(driver)

    def _attached(self, driver: CallDriver, e: ev.WorkerAttached) -> None:
        if e.reason == "takeover":
            self.calls_taken_over.inc()
        self._serving(driver)

    def _serving(self, driver: CallDriver) -> None:
        self._live.add(driver)
        self._probe_loop()

    def _started(self, _: CallDriver, e: ev.ToolCallStarted) -> None:
        (self.tool_calls_run if e.attempt <= 1 else self.tool_calls_rerun).inc()

    def _failed(self, _: CallDriver, e: ev.ToolCallFailed) -> None:
        if e.outcome_unknown:
            self.tool_calls_unknown_outcome.inc()

    def _sending(self, driver: CallDriver, e: ev.ToolResultSending) -> None:
        call = driver.state.calls.get(e.call_id)
        if call is not None and any(s.generation < e.generation
                                    for s in call.sends_of(e.part)):
            self.results_resent.inc()

    def _reconnect(self, _: CallDriver, e: ev.ReconnectRequested) -> None:
        if e.reason == "settings":
            self.prompt_changes.labels("reconnect").inc()

    def _anomaly(self, _: CallDriver, e: ev.AnomalyRecorded) -> None:
        if e.kind == "handshake_failed":
            self.handshake_failures.inc()
        elif e.kind == "connection_given_up":
            self.connections_given_up.inc()

    # ------------------------------------------------------------------ store observer
    def appended(self, seconds: float, error: BaseException | None) -> None:
        self.append_seconds.observe(seconds)
        if isinstance(error, Fenced):
            self.fencing_refusals.inc()

    # ------------------------------------------------------------------ the loop's lag
    def _probe_loop(self) -> None:
        """One probe per event loop that serves calls, started with its first call."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if loop not in self._probes:
            self._probes[loop] = loop.create_task(self._probe(), name="gemini-durable-loop-lag")

    async def _probe(self) -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(LOOP_PROBE_INTERVAL_S)
            self.event_loop_lag.observe(
                max(0.0, time.perf_counter() - began - LOOP_PROBE_INTERVAL_S))

    def stop_probes(self) -> None:
        for task in list(self._probes.values()):
            task.cancel()
        self._probes.clear()


class _StoreSide:
    """The store observer (session_store.storage.observers) of a DurableMetrics."""

    def __init__(self, metrics: DurableMetrics):
        self.appended = metrics.appended
        self.committed = metrics.commit_batch_events.observe


_installed: DurableMetrics | None = None


def install(registry: CollectorRegistry | None = None) -> DurableMetrics:
    """Register the metrics in `registry` (prometheus_client's default one if None) and feed
    them from every durable service and store of this process. Call it once, before the
    first call (a call already running when it is installed is not counted as live).
    Installing again (another registry) replaces the previous installation."""
    global _installed
    uninstall()
    metrics = DurableMetrics(REGISTRY if registry is None else registry)
    observe.add(metrics)
    observers.observe_commits(_StoreSide(metrics))
    _installed = metrics
    return metrics


def installed() -> DurableMetrics | None:
    return _installed


def uninstall() -> None:
    """Stop feeding the metrics and unregister them (the service goes back to paying
    nothing for them)."""
    global _installed
    metrics, _installed = _installed, None
    if metrics is None:
        return
    observe.remove(metrics)
    if isinstance(observers.observer, _StoreSide):
        observers.observe_commits(None)
    metrics.stop_probes()
    for collector in metrics.collectors():
        metrics.registry.unregister(collector)
