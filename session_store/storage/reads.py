"""The read side of the event log: one stream, the global order, following, snapshots, verify.

A base class of `SqlEventStore` (base.py holds the append side: the group-commit queue and
the head cache). These methods need only what the store gives every read: `_check_open`,
`_connect` (an outage becomes StoreUnavailable), `_insert` (the dialect's INSERT) and, to
follow, `_closed`, `_changed` and `poll_interval`; a dialect narrows what tailing readers
see (`_visible_to_tailing_readers`), orders them (`_after_cursor`) and wakes followers
(`_change_notifications`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sqlalchemy import func, literal_column, null, select, tuple_, union_all

from ..records import RecordedEvent
from ..schema import events, snapshots, streams
from .verify import StreamReport, verify_stream

_EVENT_COLUMNS = (events.c.stream_id, events.c.version, events.c.position, events.c.type,
                  events.c.schema_version, events.c.data, events.c.recorded_at_us,
                  events.c.hash)


def _events_and_head(stream_id: str):
    """One stream's events (version order), then its head row as (stream_id, version, NULLs,
    last_hash): one statement, one snapshot of both; the last column tells them apart."""
    rows = select(*_EVENT_COLUMNS, literal_column("0").label("is_head")).where(
        events.c.stream_id == stream_id)
    blank = [null()] * (len(_EVENT_COLUMNS) - 3)
    head = select(streams.c.stream_id, streams.c.version, *blank, streams.c.last_hash,
                  literal_column("1")).where(streams.c.stream_id == stream_id)
    both = union_all(rows, head)
    return both.order_by(both.selected_columns.is_head, both.selected_columns.version)


class _InProcessOnly:
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
    """Reads of the log (see the module's docstring for what a subclass provides)."""

    # ------------------------------------------------------------------ read
    async def read(self, stream_id: str, from_version: int = 1, to_version: int | None = None,
                   *, limit: int | None = None) -> list[RecordedEvent]:
        """Events of one stream in version order, from `from_version` (inclusive)."""
        self._check_open()
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
        async with self._connect() as conn:
            v = await conn.scalar(select(streams.c.version).where(streams.c.stream_id == stream_id))
        return v or 0

    async def stream_head(self, stream_id: str) -> tuple[int, str, int] | None:
        """The stream's head row: (version, last_hash, epoch), or None if there is none."""
        self._check_open()
        # (`_connect`, as every read: an outage is StoreUnavailable, not the driver's error.)
        async with self._connect() as conn:
            row = (await conn.execute(select(streams.c.version, streams.c.last_hash,
                                             streams.c.epoch)
                                      .where(streams.c.stream_id == stream_id))).first()
        return tuple(row) if row else None

    def _visible_to_tailing_readers(self):
        """Extra WHERE clause for read_all: only rows no in-flight writer can precede."""
        return None

    def _after_cursor(self, cursor_order, from_position: int):
        """read_all's WHERE (rows after the cursor) and ORDER BY: the global order is
        (tx_order, position), as PostgreSQL's concurrent writers need (postgres.py)."""
        return (tuple_(events.c.tx_order, events.c.position)
                > tuple_(func.coalesce(cursor_order, -1), from_position),
                (events.c.tx_order, events.c.position))

    async def read_all(self, from_position: int = 0, limit: int = 1000) -> list[RecordedEvent]:
        """Events of all streams in global order, after the event at `from_position`.

        `from_position=0` starts at the beginning; pass the last position you processed to
        continue. The order never changes once read: a tailing reader that continues from
        its last position never skips an event that commits later. A position no event has
        raises ValueError (it has no place in that order).
        """
        self._check_open()
        cursor_order = select(events.c.tx_order).where(
            events.c.position == from_position).scalar_subquery()
        # (The cursor's order comes back with the rows: see below.)
        after, order = self._after_cursor(cursor_order, from_position)
        stmt = select(*_EVENT_COLUMNS, cursor_order).where(after).order_by(*order).limit(limit)
        guard = self._visible_to_tailing_readers()
        if guard is not None:
            stmt = stmt.where(guard)
        async with self._connect() as conn:
            rows = (await conn.execute(stmt)).all()
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

    @contextlib.asynccontextmanager
    async def _change_notifications(self):
        """Yields what tells a follower whether commits elsewhere wake it: a dialect with
        cross-process notification (PostgreSQL's LISTEN) keeps it up there."""
        yield _InProcessOnly()

    async def subscribe(self, from_position: int = 0, *, stream_id: str | None = None,
                        batch_size: int = 500) -> AsyncIterator[RecordedEvent]:
        """Follow the log: every event after `from_position`, then new ones as they commit.

        Woken at once by commits in this process (and on PostgreSQL by NOTIFY from other
        processes, listening again after the connection for it was lost); otherwise it
        polls every `poll_interval` seconds (while it cannot listen: every second, plus
        the time its attempt to listen again takes, at most the connect timeout).
        A read the database does not answer raises StoreUnavailable: follow again from the
        position of the last event you got.
        """
        position = from_position
        async with self._change_notifications() as notifications:
            while not self._closed:
                changed = self._changed
                live = await notifications.listening()
                batch = await self.read_all(position, batch_size)
                for ev in batch:
                    position = ev.position
                    if stream_id is None or ev.stream_id == stream_id:
                        yield ev
                if len(batch) < batch_size:
                    wait = self.poll_interval if live else min(self.poll_interval, 1.0)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(changed.wait(), wait)

    # ------------------------------------------------------------------ snapshots
    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Cache a folded state; it never changes an answer, only how fast it is found."""
        self._check_open()
        stmt = self._insert(snapshots).values(
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
        async with self._connect() as conn:
            row = (await conn.execute(
                select(snapshots.c.stream_id, snapshots.c.version,
                       snapshots.c.projection_version, snapshots.c.state)
                .where(snapshots.c.stream_id == stream_id))).first()
        return Snapshot(*row) if row else None

    # ------------------------------------------------------------------ audit
    async def verify(self, stream_id: str | None = None) -> list[StreamReport]:
        """Recompute hash chains; one report per stream, naming the first bad event."""
        self._check_open()
        async with self._connect() as conn:
            if stream_id is None:
                ids = sorted(set((await conn.scalars(select(streams.c.stream_id))).all())
                             | set((await conn.scalars(
                                 select(events.c.stream_id).distinct())).all()))
            else:
                ids = [stream_id]
            reports = []
            for sid in ids:
                # The head and the events in one statement, so from one snapshot: read in two,
                # an append committing between them made an intact live stream "damaged"
                # (a head behind its events: "added behind the log's back").
                head, rows = None, []
                for *row, is_head in await conn.execute(_events_and_head(sid)):
                    if is_head:
                        head = (row[1], row[7])
                    else:
                        rows.append(RecordedEvent(*row))
                reports.append(verify_stream(sid, rows, head))
        return reports

