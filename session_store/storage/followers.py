"""What all followers of one store share: one change listener, and one head query per change
for every follower of a single stream.

A follower used to hold its own LISTEN connection and, woken by any commit, read the log
itself: N viewer clients held N connections and made N reads per commit. Here the store keeps
one listener (while anyone follows) and one task that, at each change, reads the heads of the
streams followed and wakes only the followers whose stream moved.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import bindparam, select

from .schema import streams

if TYPE_CHECKING:
    from .reads import LogReads

# Stream ids per head query (SQLite's limit on bound parameters is far above it).
_HEADS_PER_QUERY = 500
_HEADS = select(streams.c.stream_id, streams.c.version).where(
    streams.c.stream_id.in_(bindparam("ids", expanding=True)))


class _Listens(Protocol):
    """A dialect's notifications, as the followers ask them."""

    async def listening(self) -> bool: ...


class SharedNotifications:
    """The dialect's change notifications, opened once for all the store's followers (while
    there is one) instead of once per follower."""

    def __init__(self, open_notifications: Callable[[], contextlib.AbstractAsyncContextManager]):
        self._open = open_notifications
        self._users = 0
        self._context: contextlib.AbstractAsyncContextManager | None = None
        self._notifications: _Listens | None = None
        self._attempt: asyncio.Task | None = None

    @contextlib.asynccontextmanager
    async def use(self):
        if self._context is None:
            context = self._open()
            notifications = await context.__aenter__()
            if self._context is None:
                self._context, self._notifications = context, notifications
            else:  # (another follower opened them meanwhile)
                await context.__aexit__(None, None, None)
        self._users += 1
        try:
            yield self
        finally:
            # Taken with no await in between: a follower arriving while they close opens
            # new ones rather than using these.
            self._users -= 1
            if self._users == 0 and self._context is not None:
                context, self._context, self._attempt = self._context, None, None
                await context.__aexit__(None, None, None)

    async def listening(self) -> bool:
        """Whether commits of other processes wake the followers. One attempt to listen
        again at a time, its answer shared: during an outage, N followers asking must not
        make N connects one after the other."""
        if self._attempt is None or self._attempt.done():
            assert self._notifications is not None  # (asked by a follower inside `use`)
            self._attempt = asyncio.ensure_future(self._notifications.listening())
        return await asyncio.shield(self._attempt)


class StreamWaits:
    """Followers of single streams waiting for their stream to move past a version: one
    task reads the heads of all the streams waited for, once per change (or poll)."""

    def __init__(self, reads: LogReads):
        self._reads = reads
        self._waiting: dict[str, list[tuple[int, asyncio.Future]]] = {}
        self._poke = asyncio.Event()  # a new waiter: read the heads again now
        self._task: asyncio.Task | None = None
        self._reading: dict[tuple[str, int, int], asyncio.Future] = {}

    async def read_once(self, stream_id: str, from_version: int, limit: int) -> list:
        """`reads.read(stream_id, from_version, limit=)`, one query for all the followers
        that ask the same at once (those of one call, woken by its append, all do)."""
        key = (stream_id, from_version, limit)
        reading = self._reading.get(key)
        if reading is None:
            reading = asyncio.ensure_future(self._reads.read(stream_id,
                                                             from_version=from_version,
                                                             limit=limit))
            self._reading[key] = reading
            reading.add_done_callback(lambda _: self._reading.pop(key, None))
        return list(await asyncio.shield(reading))

    async def wait_past(self, stream_id: str, version: int) -> None:
        """Return once the stream's head is past `version` or the store closes; raise what
        reading the heads raised (StoreUnavailable in an outage)."""
        waiter = asyncio.get_running_loop().create_future()
        entry = (version, waiter)
        self._waiting.setdefault(stream_id, []).append(entry)
        self._poke.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        try:
            await waiter
        finally:
            waits = self._waiting.get(stream_id, [])
            if entry in waits:
                waits.remove(entry)
            if not waits:
                self._waiting.pop(stream_id, None)

    async def _run(self) -> None:
        reads = self._reads
        try:
            async with reads._notifications.use() as notifications:
                while self._waiting and not reads._closed:
                    changed = reads._changed
                    self._poke.clear()
                    live = await notifications.listening()
                    await self._wake_moved()
                    if self._waiting and not reads._closed:
                        await _first_of(changed, self._poke, reads.poll_interval if live
                                        else min(reads.poll_interval, 1.0))
                # Cleared with no await since the loop's test (before the listener closes):
                # a waiter from now on starts a new task.
                self._task = None
        except Exception as exc:  # noqa: BLE001 - the waiters raise it, none hangs
            self._settle_all(exc)
        finally:
            if self._task is asyncio.current_task():
                self._task = None
            if reads._closed:
                self._settle_all(None)  # followers see the store closed and stop

    async def _wake_moved(self) -> None:
        ids = list(self._waiting)
        try:
            heads: dict[str, int] = {}
            for i in range(0, len(ids), _HEADS_PER_QUERY):
                async with self._reads._connect() as conn:
                    heads.update(tuple(row) for row in await conn.execute(
                        _HEADS, {"ids": ids[i:i + _HEADS_PER_QUERY]}))
        except Exception as exc:  # noqa: BLE001 - each waiting follower raises it
            self._settle_all(exc)
            return
        for stream_id in ids:
            head = heads.get(stream_id, 0)
            for version, waiter in self._waiting.get(stream_id, ()):
                if head > version and not waiter.done():
                    waiter.set_result(None)

    def _settle_all(self, exc: BaseException | None) -> None:
        for waits in self._waiting.values():
            for _version, waiter in waits:
                if not waiter.done():
                    if exc is None:
                        waiter.set_result(None)
                    else:
                        waiter.set_exception(exc)


async def _first_of(a: asyncio.Event, b: asyncio.Event, timeout: float) -> None:
    tasks = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
