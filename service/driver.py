"""The service's handle on its call's log: observe → decide → append → fold; what is due.

This is the imperative shell's only path to the log, and it has no pipecat in it. Live
operation and takeover after a crash use it the same way: `attach()` loads the state (and, for
an existing call, records the new worker with a higher fencing epoch), then every observation
goes through `observe()` and every effect's outcome through `record()`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid

from session_store import Policy, SessionState, choose_resumption, decide, due, load_state
from session_store import events as ev
from session_store.decide import Effect, Observation
from session_store.errors import ConcurrencyConflict, Fenced
from session_store.projection import fold_into
from session_store.storage import SqlEventStore

log = logging.getLogger(__name__)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def now_us() -> int:
    return time.time_ns() // 1000


class CallDriver:
    """Owns the in-memory state of one call and keeps it equal to the fold of the log."""

    def __init__(self, store: SqlEventStore, call_id: str, policy: Policy | None = None,
                 worker_id: str | None = None):
        self.store, self.call_id = store, call_id
        self.policy = policy or Policy()
        self.worker_id = worker_id or default_worker_id()
        self.state = SessionState(stream_id=call_id)
        self.epoch = 0
        self.fenced = False
        self._lock = asyncio.Lock()

    async def attach(self, *, model: str, tools: list[str], settings: dict) -> SessionState:
        """Open the call, or take it over: a new fencing epoch shuts the old worker out (I6)."""
        async with self._lock:
            for _ in range(5):
                self.state = await load_state(self.store, self.call_id)
                epoch = self.state.epoch + 1
                first = (ev.SessionOpened(model, tools, self.worker_id, epoch, settings)
                         if not self.state.opened
                         else ev.WorkerAttached(self.worker_id, epoch, "takeover"))
                try:
                    await self._append([first], epoch)
                except ConcurrencyConflict:
                    continue  # another worker moved the stream: read again and retry
                self.epoch = epoch
                return self.state
            raise ConcurrencyConflict(self.call_id, self.state.version, None)

    async def record(self, *events: ev.Event) -> None:
        """Append events (write-ahead) and fold them into the state."""
        async with self._lock:
            await self._record_locked(list(events))

    async def _record_locked(self, events: list[ev.Event]) -> None:
        if self.fenced:
            raise Fenced(self.call_id, self.epoch, self.state.epoch)
        try:
            await self._append(events, self.epoch)
        except Fenced:
            self.fenced = True
            raise
        except ConcurrencyConflict:
            # Someone else wrote to our call: only a newer worker may. Re-read to find out.
            self.state = await load_state(self.store, self.call_id)
            if self.state.epoch > self.epoch:
                self.fenced = True
                raise Fenced(self.call_id, self.epoch, self.state.epoch) from None
            raise

    async def _append(self, events: list[ev.Event], epoch: int) -> None:
        before = self.state.version
        await self.store.append(self.call_id, events, before, epoch=epoch)
        # Fold exactly what was stored (its recorded times included): the in-memory state is
        # then identical to what a new worker folds from the log.
        fold_into(self.state, await self.store.read(self.call_id, from_version=before + 1))

    async def observe(self, obs: Observation) -> list[ev.Event]:
        """Record an observation and what was decided about it; returns the events."""
        async with self._lock:
            events = decide(self.state, obs, self.policy)
            if events:
                await self._record_locked(events)
            return events

    def due(self) -> list[Effect]:
        return [] if self.fenced else due(self.state, self.policy, now_us())

    def resumption_handle(self, exclude: set[str] = frozenset()) -> str | None:
        handle = choose_resumption(self.state, self.policy, now_us())
        return None if handle in exclude else handle
