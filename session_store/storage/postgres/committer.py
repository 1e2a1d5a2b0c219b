"""PostgreSQL's committer: each writer task owns one asyncpg connection and writes a whole
batch with array parameters (`unnest`), and what asyncpg's errors mean.

A batch planned from cached stream heads is one round trip, one statement in its own
transaction: for one stream (an idle store's append), a statement that updates the head row
only where it still holds the cached head and inserts the events only if it did; for several,
a function (created per writer connection in its temporary schema, so no migration) that
locks the heads, updates them the same way and raises unless all held, so no head moves
without its events. If a head moved (another store wrote), nothing is written and the batch
takes the transaction path: BEGIN, read the heads FOR UPDATE, plan, write, COMMIT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from ..batch import (CLOSED_TYPE, BatchPlan, _AppendRequest, _RetryBatch, claims_wanted,
                     plan_batch, stored_hashes_wanted)
from ..group_commit import describe_outage
from ..heads import unplan
from .listener import close_quickly
from .statements import (APPEND_ONE, CALL_FN, CREATE_FN, HEADS_MOVED, INSERT_EVENTS,
                         INSERT_STREAMS, SELECT_CLOSED, SELECT_HASHES, SELECT_HEADS,
                         UPDATE_STREAMS)

log = logging.getLogger(__name__)


def _columns(rows: list[tuple]) -> list[list]:
    return [list(col) for col in zip(*rows)]


class PostgresCommitter:
    """The group commit's `Committer` on PostgreSQL: several writer connections, row locks
    only. No caller's-thread commits: every commit is a network round trip."""

    caller_commits = None
    describe_outage = staticmethod(describe_outage)

    def __init__(self, writer_kwargs: dict, channel: str):
        # asyncpg.connect's arguments for a writer connection.
        self._writer_kwargs = writer_kwargs
        self._channel = channel  # NOTIFY'd by every commit (listener.py)
        self._free: list[asyncpg.Connection] = []
        self._has_fn = True  # off if this role may not create temporary functions

    async def _connect_writer(self) -> asyncpg.Connection:
        conn = await asyncpg.connect(**self._writer_kwargs)
        if self._has_fn:
            try:
                await conn.execute(CREATE_FN)
            except asyncpg.InsufficientPrivilegeError as exc:
                log.warning("no TEMP privilege (%s): batches of several streams take the "
                            "transaction path", exc)
                self._has_fn = False
            except BaseException:
                conn.terminate()
                raise
        return conn

    @contextlib.asynccontextmanager
    async def _writer_connection(self):
        """A dedicated connection per writer task, replaced when it breaks."""
        while self._free and self._free[-1].is_closed():
            self._free.pop()  # the server ended it while it was idle
        reused = bool(self._free)
        conn = self._free.pop() if self._free else await self._connect_writer()
        try:
            yield conn
        except asyncpg.InternalClientError as exc:
            conn.terminate()
            if reused:
                # A server shutting down (`pg_ctl stop -m fast`) sends an idle connection its
                # FATAL error before closing it; read before the close, it leaves asyncpg's
                # protocol busy, and the next statement fails with "cannot switch to state
                # 15; another operation (2) is in progress" (seen in tests/faults, a few per
                # restart of 100 calls). Nothing was committed on it: retry on a new one.
                raise _RetryBatch() from exc
            raise
        except BaseException:
            conn.terminate()
            raise
        else:
            self._free.append(conn)

    async def run_batch(self, batch: list[_AppendRequest], cached: BatchPlan | None
                        ) -> BatchPlan:
        if cached is not None and len(cached.updated) > 1 and not self._has_fn:
            unplan(batch)
            cached = None
        async with self._writer_connection() as conn:
            stale = False
            if cached is not None:
                if await self._write_cached(conn, cached):
                    return cached
                # Nothing was written (the statement did nothing, or failed as a whole); the
                # connection is fine.
                unplan(batch)
                stale = True
            # BEGIN and COMMIT of our own, no `conn.transaction()`: on any failure,
            # `_writer_connection` drops the connection and the server rolls back. The
            # context manager's ROLLBACK after a cut attempt waited for the server's answer
            # to asyncpg's cancel request, for as long as a partition lasted.
            await conn.execute("BEGIN")
            plan = await self._plan_and_write(conn, batch)
            await conn.execute("COMMIT")
            plan.stale = stale
            return plan

    async def _write_cached(self, conn, plan) -> bool:
        """One round trip; False if a head moved (then nothing was written)."""
        if len(plan.updated) == 1:
            (sid, v, h, e, t, ov, oh, oe), = plan.updated
            written = await conn.fetch(APPEND_ONE, sid, v, h, e, t, ov, oh, oe,
                                       *_columns(plan.events)[1:], self._channel)
            return bool(written)
        try:
            await conn.execute(CALL_FN, *_columns(plan.updated), *_columns(plan.events),
                               self._channel)
            return True
        except asyncpg.PostgresError as exc:
            if exc.sqlstate != HEADS_MOVED:
                raise
            return False

    async def _plan_and_write(self, conn, batch):
        ids = sorted({r.stream_id for r in batch})
        heads = {row[0]: (row[1], row[2], row[3])
                 for row in await conn.fetch(SELECT_HEADS, ids)}
        wanted = stored_hashes_wanted(batch)  # (only a retry wants any)
        stored = ({(row[0], row[1]): row[2]
                   for row in await conn.fetch(SELECT_HASHES, *_columns(wanted))}
                  if wanted else None)
        claims = claims_wanted(batch)  # (only a takeover has any)
        closed = ({(row[0], row[1]): row[2]
                   for row in await conn.fetch(SELECT_CLOSED, *_columns(claims), CLOSED_TYPE)}
                  if claims else None)
        plan = plan_batch(batch, heads, stored, closed)
        if not plan.events:
            return plan
        if plan.created:
            inserted = await conn.fetch(INSERT_STREAMS, *_columns(plan.created))
            if len(inserted) != len(plan.created):
                # Another writer created one of these streams since we looked.
                raise _RetryBatch()
        if plan.updated:  # rows locked FOR UPDATE above: they hold what was read
            await conn.execute(UPDATE_STREAMS, *_columns([u[:5] for u in plan.updated]))
        await conn.execute(INSERT_EVENTS, *_columns(plan.events), self._channel)
        return plan

    def attempt_abandoned(self) -> None:
        """(A cut attempt's connection is terminated by `_writer_connection`: the server
        rolls its transaction back.)"""

    def is_outage(self, exc: BaseException) -> bool:
        # Unreachable or refused (OSError), the connection lost mid-statement, the server
        # starting up or shutting down, restarting after a crash of one of its processes;
        # InternalClientError: an idle connection the server terminated (its FATAL message
        # arrived before the socket closed) refuses the next statement; nothing was sent.
        # LockNotAvailableError: a head row stayed locked past the writer's `lock_timeout`
        # (a frozen writer): the database does not take the append for now; raised as is,
        # it reached the caller at once, outside the append's contract, never retried.
        # ReadOnlySQLTransactionError: a standby (a failover under way) or a database set
        # read-only; as SQLite's SQLITE_READONLY, wait for it (on a new connection).
        return isinstance(exc, (OSError, ConnectionError, asyncpg.PostgresConnectionError,
                                asyncpg.InterfaceError, asyncpg.CannotConnectNowError,
                                asyncpg.AdminShutdownError, asyncpg.CrashShutdownError,
                                asyncpg.InternalClientError, asyncpg.LockNotAvailableError,
                                asyncpg.ReadOnlySQLTransactionError))

    async def close(self) -> None:
        free, self._free = self._free, []
        await asyncio.gather(*(close_quickly(conn) for conn in free))
