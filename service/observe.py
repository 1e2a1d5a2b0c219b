"""What the durable service tells observers of its calls: metrics (metrics.py), traces
(tracing.py).

The driver reports the events each commit stored, the service reports when a call leaves
this worker; a sink reads what it counts from the events themselves (a tool re-run is a
`tool.call_started` of attempt 2 or more, a takeover a `worker.attached`, ...), so nothing
in the service decides twice. With no sink installed (the default) a commit pays one
truthiness test of `SINKS`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from session_store import events as ev

if TYPE_CHECKING:
    from .driver import CallDriver

log = logging.getLogger(__name__)


class Sink(Protocol):
    def committed(self, driver: CallDriver, events: Sequence[ev.Event]) -> None:
        """`events` are in the call's log now (an attach's first event included), folded
        into `driver.state`."""

    def left(self, driver: CallDriver, why: str) -> None:
        """The call is no longer served here: "ended" (its end is logged), "taken_over" (a
        newer worker fenced this one out) or "stopped" (the pipeline stopped with the call
        still open: the caller's stream closed, a worker shutting down). Told once or more."""


#: The sinks of this process, in the order installed. Mutated in place (`add`, `remove`):
#: the driver reads it at every commit.
SINKS: list[Sink] = []


def add(sink: Sink) -> None:
    if sink not in SINKS:
        SINKS.append(sink)


def remove(sink: Sink) -> None:
    if sink in SINKS:
        SINKS.remove(sink)


def committed(driver: CallDriver, events: Sequence[ev.Event]) -> None:
    for sink in SINKS:
        try:
            sink.committed(driver, events)
        except Exception:  # noqa: BLE001 - the commit happened: its caller must go on
            log.exception("observer %r failed on a commit of %s", sink, driver.call_id)


def left(driver: CallDriver, why: str) -> None:
    for sink in SINKS:
        try:
            sink.left(driver, why)
        except Exception:  # noqa: BLE001 - as above
            log.exception("observer %r failed on %s leaving", sink, driver.call_id)
