"""The read side of the event log: one stream, the global order, following, snapshots, and
the hash chains as stored (for `session_store.audit.verify`).

`LogReads` is the read half of `SqlEventStore` (store.py adds opening, closing, appends): it
sets up what reads use itself (the dialect, the open and read-only state, the pooled
connections, the change signal) and asks the dialect (dialect.py) only for what differs:
its INSERT, the global order, and what wakes followers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import (
    BigInteger, Integer, bindparam, func, literal_column, null, select, tuple_, union_all,
)
from sqlalchemy.exc import DatabaseError, OperationalError

from ..errors import StoreClosed, StoreUnavailable, StreamDamaged, driver_said
from ..records import RecordedEvent
from .schema import check_stream_id, events, snapshots, streams
from .followers import SharedNotifications, StreamWaits

if TYPE_CHECKING:
    from .dialect import Dialect

_EVENT_COLUMNS = (events.c.stream_id, events.c.version, events.c.position, events.c.type,
                  events.c.schema_version, events.c.data, events.c.recorded_at_us,
                  events.c.hash)

# `read_all`'s page, built once (by the dialect) and bound at each read: the cursor (the
# event at `from_position`), its place in the global order, the page's size.
_CURSOR = bindparam("cursor", type_=BigInteger)
_CURSOR_ORDER = select(events.c.tx_order).where(events.c.position == _CURSOR).scalar_subquery()
_PAGE_LIMIT = bindparam("page_limit", type_=Integer)


def _events_and_head(stream_id: str):
    """One stream's events (version order), then its head row as (stream_id, version, epoch,
    NULLs, last_hash): one statement, one snapshot of both; the last column tells them
    apart."""
    rows = select(*_EVENT_COLUMNS, literal_column("0").label("is_head")).where(
        events.c.stream_id == stream_id)
    blank = [null()] * (len(_EVENT_COLUMNS) - 4)
    head = select(streams.c.stream_id, streams.c.version, streams.c.epoch, *blank,
                  streams.c.last_hash, literal_column("1")).where(
                      streams.c.stream_id == stream_id)
    both = union_all(rows, head)
    return both.order_by(both.selected_columns.is_head, both.selected_columns.version)


class InProcessOnly:
    """Change notifications of a store without cross-process ones: in-process wake-ups
    always work; commits of other processes are found by polling."""

    async def listening(self) -> bool:
        return True


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass
class StreamHead:
    stream_id: str
    version: int
    epoch: int
    created_at_us: int
    updated_at_us: int


@dataclass
class Snapshot:
    stream_id: str
    version: int
    projection_version: int
    state_json: str


class LogReads:
    """Reads of the log, over the pool of the dialect's engine."""

    def __init__(self, dialect: Dialect):
        self._dialect = dialect
        self._engine = dialect.engine
        self._read_only = bool(dialect.read_only)
        self._closed = False  # the store was closed: reads refused, followers stop
        self._changed = asyncio.Event()  # set (and replaced) by `_signal_change` at each commit
        #: Wait for a change notification at most this long before polling the table again.
        self.poll_interval = dialect.poll_interval
        # One listener and one head reader for all of this store's followers (followers.py).
        self._notifications = SharedNotifications(
            lambda: dialect.change_notifications(self._signal_change))
        self._stream_waits = StreamWaits(self)
        self._probing: asyncio.Future | None = None  # (`unreachable`)
        # (The cursor's order comes back with the rows: see `read_all`.)
        self._page = dialect.page_statement((*_EVENT_COLUMNS, _CURSOR_ORDER), _CURSOR,
                                            _CURSOR_ORDER, _PAGE_LIMIT)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")

    def _check_writable(self) -> None:
        if self._read_only:
            raise StoreClosed("this store was opened read_only: it takes no appends (nor "
                              "snapshots)")

    @contextlib.asynccontextmanager
    async def _connect(self, *, begin: bool = False):
        """A pooled connection for reads (and snapshot writes). A database that is down
        gives StoreUnavailable naming the cause, as an append does, not the driver's own
        exception (a bare ConnectionRefusedError, a wrapped "the database system is starting
        up"), so callers can tell an outage from a bug."""
        try:
            async with (self._engine.begin() if begin else self._engine.connect()) as conn:
                yield conn
        except Exception as exc:  # noqa: BLE001 - sorted out below
            outage = self.outage_of(exc)
            if outage is None:
                raise
            raise outage from exc

    def outage_of(self, exc: BaseException) -> StoreUnavailable | None:
        """StoreUnavailable naming the cause if `exc` is the driver's error for a database
        that is down (however wrapped), else None."""
        cause = self._outage_cause(exc)
        if cause is None:
            return None
        return StoreUnavailable("cannot reach the database "
                                f"({self._dialect.committer.describe_outage(cause)})")

    def _outage_cause(self, exc: BaseException) -> BaseException | None:
        """The driver's outage error behind `exc`, which SQLAlchemy may have wrapped (`orig`,
        and the asyncpg adapter's `__cause__`)."""
        orig = getattr(exc, "orig", None)
        for candidate in (exc, orig, getattr(orig, "__cause__", None)):
            if candidate is not None and not isinstance(candidate, StoreUnavailable) \
                    and self._dialect.committer.is_outage(candidate):
                return candidate
        return None

    async def unreachable(self, timeout: float) -> str | None:
        """Why the database does not answer a new connection within `timeout` seconds, or
        None if it does (always, for a database that is a file: SQLite). One probe at a
        time, its answer shared: many slow pages must not open a connection each."""
        if self._probing is None or self._probing.done():
            self._probing = asyncio.ensure_future(self._probe(timeout))
        return await asyncio.shield(self._probing)

    async def _probe(self, timeout: float) -> str | None:
        probe = getattr(self._dialect, "probe", None)
        if probe is None:
            return None
        try:
            await probe(timeout)
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the reason
            return self._dialect.committer.describe_outage(exc)
        return None

    # ------------------------------------------------------------------ read
    async def read(self, stream_id: str, from_version: int = 1, to_version: int | None = None,
                   *, limit: int | None = None) -> list[RecordedEvent]:
        """Events of one stream in version order, from `from_version` (inclusive)."""
        self._check_open()
        check_stream_id(stream_id)
        stmt = (select(*_EVENT_COLUMNS)
                .where(events.c.stream_id == stream_id, events.c.version >= from_version)
                .order_by(events.c.version))
        if to_version is not None:
            stmt = stmt.where(events.c.version <= to_version)
        if limit is not None:
            stmt = stmt.limit(limit)
        async with self._connect() as conn:
            return [RecordedEvent(*row) for row in await conn.execute(stmt)]

    async def stream_version(self, stream_id: str) -> int:
        self._check_open()
        check_stream_id(stream_id)
        async with self._connect() as conn:
            v = await conn.scalar(select(streams.c.version).where(streams.c.stream_id == stream_id))
        return v or 0

    async def stream_head(self, stream_id: str) -> tuple[int, str, int] | None:
        """The stream's head row: (version, last_hash, epoch), or None if there is none."""
        self._check_open()
        check_stream_id(stream_id)
        # (`_connect`, as every read: an outage is StoreUnavailable, not the driver's error.)
        async with self._connect() as conn:
            row = (await conn.execute(select(streams.c.version, streams.c.last_hash,
                                             streams.c.epoch)
                                      .where(streams.c.stream_id == stream_id))).first()
        return tuple(row) if row else None

    async def read_all(self, from_position: int = 0, limit: int = 1000) -> list[RecordedEvent]:
        """Events of all streams in global order, after the event at `from_position`.

        `from_position=0` starts at the beginning; pass the last position you processed to
        continue. The order never changes once read: a tailing reader that continues from
        its last position never skips an event that commits later. A position no event has
        raises ValueError (it has no place in that order).
        """
        self._check_open()
        async with self._connect() as conn:
            rows = await self._dialect.read_page(
                conn, self._page, {"cursor": from_position, "page_limit": limit}, limit)
            # An empty page says nothing of the cursor (the rows carry its order): ask. (A
            # follower that is caught up pays one primary-key lookup per poll.)
            unknown = (rows[0][-1] is None if rows else from_position > 0 and (
                await conn.scalar(select(events.c.position)
                                  .where(events.c.position == from_position))) is None)
        if from_position > 0 and unknown:
            # A position no event has has no place in the global order: the rows above
            # are the whole log from the start, and a follower would process every event
            # again (or, with nothing visible yet, think itself caught up). Say so instead.
            raise ValueError(f"no event at position {from_position}: continue from the "
                             "position of an event read_all returned (0: the beginning)")
        return [RecordedEvent(*row[:-1]) for row in rows]

    async def list_streams(self, *, limit: int | None = None, after: str | None = None
                           ) -> list[StreamHead]:
        self._check_open()
        stmt = select(streams.c.stream_id, streams.c.version, streams.c.epoch,
                      streams.c.created_at_us, streams.c.updated_at_us).order_by(
                          streams.c.stream_id)
        if after is not None:
            stmt = stmt.where(streams.c.stream_id > after)
        if limit is not None:
            stmt = stmt.limit(limit)
        async with self._connect() as conn:
            return [StreamHead(*row) for row in await conn.execute(stmt)]

    # ------------------------------------------------------------------ follow
    def _signal_change(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _change_notifications(self) -> contextlib.AbstractAsyncContextManager:
        """Yields what tells a follower whether commits elsewhere wake it: a dialect with
        cross-process notification (PostgreSQL's LISTEN) keeps it up there, one for all
        the store's followers."""
        return self._notifications.use()

    async def subscribe(self, from_position: int = 0, *, stream_id: str | None = None,
                        after_version: int | None = None, batch_size: int = 500
                        ) -> AsyncIterator[RecordedEvent]:
        """Follow the log: every event after `from_position`, then new ones as they commit.

        With `stream_id`, only that stream's, read from the stream itself (never the rest of
        the log): those after `after_version`, or else those after the event at
        `from_position` in the global order. Woken at once by commits in this process (and
        on PostgreSQL by NOTIFY from other processes, on one connection for all followers,
        listening again after it was lost); otherwise it polls every `poll_interval`
        seconds (while it cannot listen: every second, plus the time its attempt to listen
        again takes, at most the connect timeout).
        A read the database does not answer raises StoreUnavailable: follow again from the
        position (or version) of the last event you got. Closing the store ends it.
        """
        try:
            async for ev in self._follow(from_position, stream_id, after_version, batch_size):
                yield ev
        except StoreClosed:
            if not self._closed:
                raise
            # The close came while a read was under way (after the loop's check): it ends
            # the follower as a close between reads does.

    async def _follow(self, from_position: int, stream_id: str | None,
                      after_version: int | None, batch_size: int
                      ) -> AsyncIterator[RecordedEvent]:
        if stream_id is None:
            if after_version is not None:
                raise ValueError("after_version is a version of one stream: give stream_id")
            async for ev in self._follow_log(from_position, batch_size):
                yield ev
            return
        check_stream_id(stream_id)
        version = (after_version if after_version is not None
                   else await self._version_at(stream_id, from_position))
        while not self._closed:
            batch = await self._stream_waits.read_once(stream_id, version + 1, batch_size)
            for ev in batch:
                version = ev.version
                yield ev
            if len(batch) < batch_size:
                await self._stream_waits.wait_past(stream_id, version)

    async def _version_at(self, stream_id: str, position: int) -> int:
        """The stream's last version at or before the event at `position` in the global
        order (0: none); ValueError if no event has that position."""
        if position == 0:
            return 0
        order = self._dialect.global_order()
        at = [select(c).where(events.c.position == position).scalar_subquery() for c in order]
        async with self._connect() as conn:
            if await conn.scalar(select(events.c.position)
                                 .where(events.c.position == position)) is None:
                raise ValueError(f"no event at position {position}: continue from the "
                                 "position of an event read_all returned (0: the beginning)")
            return await conn.scalar(select(func.coalesce(func.max(events.c.version), 0)).where(
                events.c.stream_id == stream_id,
                (tuple_(*order) <= tuple_(*at)) if len(order) > 1 else order[0] <= at[0]))

    async def _follow_log(self, from_position: int, batch_size: int
                          ) -> AsyncIterator[RecordedEvent]:
        position = from_position
        async with self._change_notifications() as notifications:
            while not self._closed:
                changed = self._changed
                live = await notifications.listening()
                batch = await self.read_all(position, batch_size)
                for ev in batch:
                    position = ev.position
                    yield ev
                if len(batch) < batch_size:
                    wait = self.poll_interval if live else min(self.poll_interval, 1.0)
                    # asyncio.timeout, not wait_for: on 3.11, wait_for returns the wake-up
                    # when a cancel meets it, and the cancel is lost (the follower went on).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await changed.wait()

    # ------------------------------------------------------------------ snapshots
    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Cache a folded state; it never changes an answer, only how fast it is found."""
        self._check_open()
        self._check_writable()
        check_stream_id(snapshot.stream_id)
        stmt = self._dialect.insert(snapshots).values(
            stream_id=snapshot.stream_id, version=snapshot.version,
            projection_version=snapshot.projection_version, state=snapshot.state_json,
            created_at_us=now_us())
        stmt = stmt.on_conflict_do_update(
            index_elements=["stream_id"],
            set_={"version": stmt.excluded.version,
                  "projection_version": stmt.excluded.projection_version,
                  "state": stmt.excluded.state, "created_at_us": stmt.excluded.created_at_us},
            where=snapshots.c.version < stmt.excluded.version)
        async with self._connect(begin=True) as conn:
            await conn.execute(stmt)

    async def load_snapshot(self, stream_id: str) -> Snapshot | None:
        self._check_open()
        check_stream_id(stream_id)
        async with self._connect() as conn:
            row = (await conn.execute(
                select(snapshots.c.stream_id, snapshots.c.version,
                       snapshots.c.projection_version, snapshots.c.state)
                .where(snapshots.c.stream_id == stream_id))).first()
        return Snapshot(*row) if row else None

    # ------------------------------------------------------------------ chains
    async def read_chains(self, stream_id: str | None = None
                          ) -> AsyncIterator[tuple[str, list[RecordedEvent] | StreamDamaged,
                                                   tuple[int, str, int] | None]]:
        """Each stream's events (version order) with its head row (version, last_hash, epoch;
        None if it has none), stream by stream in id order: every stream that has a head row
        or events, or only `stream_id`. What `session_store.audit.verify` checks. A stream whose
        rows the database cannot read comes as (id, StreamDamaged, None)."""
        self._check_open()
        if stream_id is not None:
            check_stream_id(stream_id)
        async with self._connect() as conn:
            if stream_id is None:
                ids = sorted(set((await conn.scalars(select(streams.c.stream_id))).all())
                             | set((await conn.scalars(
                                 select(events.c.stream_id).distinct())).all()))
            else:
                ids = [stream_id]
            for sid in ids:
                # The head and the events in one statement, so from one snapshot: read in two,
                # an append committing between them made an intact live stream "damaged"
                # (a head behind its events: "added behind the log's back").
                head, rows = None, []
                try:
                    for *row, is_head in await conn.execute(_events_and_head(sid)):
                        if is_head:
                            head = (row[1], row[7], row[2])
                        else:
                            rows.append(RecordedEvent(*row))
                except DatabaseError as exc:
                    if isinstance(exc, OperationalError):
                        raise  # (no answer at all: nothing further would read either)
                    # A damaged page (SQLite: "malformed") spoils the rows on it, not the
                    # other streams': verify names this one and goes on.
                    yield sid, StreamDamaged(f"its rows cannot be read ({driver_said(exc)})",
                                             stream_id=sid), None
                    continue
                yield sid, rows, head
