"""PostgreSQL over asyncpg: several writer connections, row locks only, reader-safe order.

Positions come from an identity column, so two transactions can commit out of position order
and a reader that moves past a gap would miss the late one (the classic event-store gap).
Instead of serialising writers with a table lock, each row records its transaction id
(`tx_order`) and tailing readers see only rows whose transaction id is below the oldest
transaction still running (`pg_snapshot_xmin`): no transaction can later commit an event
that sorts before what a reader has already seen in (tx_order, position) order.

The hot path talks to asyncpg directly: each writer task owns one connection and writes a
whole batch with array parameters (`unnest`). A batch planned from cached stream heads is one
round trip, one statement in its own transaction: for one stream (an idle store's append), a
statement that updates the head row only where it still holds the cached head and inserts the
events only if it did; for several, a function (created per writer connection in its temporary
schema, so no migration) that locks the heads, updates them the same way and raises unless all
held, so no head moves without its events. If a head moved (another store wrote), nothing is
written and the batch takes the transaction path: BEGIN, read the heads FOR UPDATE, plan,
write, COMMIT.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re

import asyncpg
from sqlalchemy import BigInteger, Text, cast, func
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from ..schema import events, streams
from . import SQLALCHEMY_ONLY_OPTIONS
from ..checks import check_count, check_seconds
from .base import SqlEventStore
from .batch import _RetryBatch, plan_batch, stored_hashes_wanted

log = logging.getLogger(__name__)


def check_schema_name(schema: str) -> str:
    """A PostgreSQL schema name from configuration, checked: a plain identifier only (it goes
    into the search path, and a value like "a,b" or one with quotes would mean another)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", schema):
        raise ValueError(f"invalid schema name {schema!r}: use letters, digits and _ "
                         "(at most 63, not starting with a digit)")
    return schema


def notify_channel(schema: str | None) -> str:
    """The NOTIFY channel of a schema's log. PostgreSQL refuses a channel name of 64 bytes or
    more ("channel name too long", failing every append, whose statement notifies), and a
    schema name may have 63: a long one is named by its hash instead (same for everyone)."""
    channel = f"session_store_{schema or 'public'}".lower()
    if len(channel) > 63:
        channel = "session_store_" + hashlib.sha256(channel.encode()).hexdigest()[:40]
    return channel


def _as_bigint(expr):
    return cast(cast(expr, Text), BigInteger)


_S, _E = streams.name, events.name
_SELECT_HEADS = (f"SELECT stream_id, version, last_hash, epoch FROM {_S} "
                 "WHERE stream_id = ANY($1::text[]) ORDER BY stream_id FOR UPDATE")
# The stored hashes at (stream, version) pairs: what a retried request committed, if it did.
_SELECT_HASHES = (f"SELECT e.stream_id, e.version, e.hash FROM {_E} AS e JOIN "
                  "unnest($1::text[], $2::bigint[]) AS u(s, v) "
                  "ON e.stream_id = u.s AND e.version = u.v")
_INSERT_STREAMS = (
    f"INSERT INTO {_S} (stream_id, version, last_hash, epoch, created_at_us, updated_at_us) "
    "SELECT s, v, h, e, t, t FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], "
    "$5::bigint[]) AS u(s, v, h, e, t) ON CONFLICT (stream_id) DO NOTHING RETURNING stream_id")
_UPDATE_STREAMS = (
    f"UPDATE {_S} SET version = u.v, last_hash = u.h, epoch = u.e, updated_at_us = u.t "
    "FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[]) "
    f"AS u(s, v, h, e, t) WHERE {_S}.stream_id = u.s")
# The NOTIFY rides in the same statement; it is delivered when the transaction commits.
_INSERT_EVENTS = (
    f"WITH ins AS (INSERT INTO {_E} (tx_order, stream_id, version, type, schema_version, data, "
    "recorded_at_us, hash) SELECT pg_current_xact_id()::text::bigint, s, v, ty, sv, d, t, h "
    "FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::text[], $6::bigint[], "
    "$7::text[]) AS u(s, v, ty, sv, d, t, h)) SELECT pg_notify($8, '')")


# SQLSTATE the function raises when a head moved (a class no PostgreSQL error uses).
_HEADS_MOVED = "SSH01"
_FN = "pg_temp.session_store_append"
_CREATE_FN = f"""
CREATE OR REPLACE FUNCTION {_FN}(
    text[], bigint[], text[], bigint[], bigint[], bigint[], text[], bigint[],
    text[], bigint[], text[], int[], text[], bigint[], text[], text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    moved bigint;
BEGIN
    -- Heads locked in one global order, as on the transaction path: writers never deadlock.
    -- (One head is locked by the UPDATE itself.)
    IF cardinality($1) > 1 THEN
        PERFORM 1 FROM {_S} WHERE stream_id = ANY($1) ORDER BY stream_id FOR UPDATE;
    END IF;
    UPDATE {_S} AS st SET version = u.v, last_hash = u.h, epoch = u.e, updated_at_us = u.t
    FROM unnest($1, $2, $3, $4, $5, $6, $7, $8) AS u(s, v, h, e, t, ov, oh, oe)
    WHERE st.stream_id = u.s AND st.version = u.ov AND st.last_hash = u.oh AND st.epoch = u.oe;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved <> cardinality($1) THEN
        RAISE EXCEPTION 'a stream head moved since it was cached' USING ERRCODE = '{_HEADS_MOVED}';
    END IF;
    INSERT INTO {_E} (tx_order, stream_id, version, type, schema_version, data, recorded_at_us,
                      hash)
    SELECT pg_current_xact_id()::text::bigint, s, v, ty, sv, d, t, h
    FROM unnest($9, $10, $11, $12, $13, $14, $15) AS u(s, v, ty, sv, d, t, h);
    PERFORM pg_notify($16, '');
END
$fn$"""
_CALL_FN = f"SELECT {_FN}({', '.join(f'${i}' for i in range(1, 17))})"
# One stream: one plain statement (cheaper than the function). Nothing to undo if the head
# moved: no row updated, so no event inserted; it then returns no row.
_APPEND_ONE = f"""
WITH head AS (
    UPDATE {_S} SET version = $2, last_hash = $3, epoch = $4, updated_at_us = $5
    WHERE stream_id = $1 AND version = $6 AND last_hash = $7 AND epoch = $8 RETURNING 1),
ins AS (
    INSERT INTO {_E} (tx_order, stream_id, version, type, schema_version, data, recorded_at_us,
                      hash)
    SELECT pg_current_xact_id()::text::bigint, $1, v, ty, sv, d, t, h
    FROM unnest($9::bigint[], $10::text[], $11::int[], $12::text[], $13::bigint[], $14::text[])
        AS u(v, ty, sv, d, t, h)
    WHERE EXISTS (SELECT 1 FROM head))
SELECT pg_notify($15, '') FROM head"""


CLOSE_WAIT_S = 1.0


def _columns(rows: list[tuple]) -> list[list]:
    return [list(col) for col in zip(*rows)]


class PostgresEventStore(SqlEventStore):
    dialect_name = "postgresql"
    # Few writers, big batches: on a small machine more writers only means more transactions
    # competing with the server for the same CPUs (bench/concurrent_calls.py).
    default_writers = 2
    poll_interval = 0.5  # NOTIFY wakes followers at once; polling only covers a lost notify

    def __init__(self, url: str, *, schema: str | None = None, pool_size: int = 8,
                 attempt_timeout: float | None = 5.0, read_timeout: float | None = 30.0,
                 **kwargs):
        """`attempt_timeout`: seconds a connect or commit may go unanswered before it is
        abandoned as an outage and retried (a host behind a dead network never answers:
        TCP would let it wait for minutes); `read_timeout`: the same for a read, which then
        raises StoreUnavailable."""
        check_count("pool_size", pool_size)
        check_seconds("attempt_timeout", attempt_timeout, none_ok=True)
        check_seconds("read_timeout", read_timeout, none_ok=True)
        server_settings = {"synchronous_commit": "on", "application_name": "session_store"}
        if schema:
            server_settings["search_path"] = check_schema_name(schema)
        connect_timeout = attempt_timeout or 60.0  # (asyncpg's own default)
        engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size,
                                     pool_pre_ping=True,
                                     connect_args={"server_settings": server_settings,
                                                   "timeout": connect_timeout,
                                                   "command_timeout": read_timeout})
        super().__init__(engine, attempt_timeout=attempt_timeout, **kwargs)
        # The writers' and the listener's own connections take the URL as SQLAlchemy's pool
        # does (its dialect's connect arguments): host, port and credentials, and the query's
        # options too (`?ssl=require`, `?host=/run/postgresql`). Built from the URL's parts
        # alone, they dropped the query: appends went in clear text where TLS was asked for,
        # or to the environment's default host.
        _args, params = engine.sync_engine.dialect.create_connect_args(make_url(url))
        for adaptor_only in SQLALCHEMY_ONLY_OPTIONS:
            params.pop(adaptor_only, None)
        self._connect_kwargs = dict(params, server_settings=server_settings,
                                    timeout=connect_timeout)
        # A writer frozen mid-batch (SIGSTOP, a paused VM) must not hold stream-head row
        # locks forever: the server ends its transaction, and waiting writers give up on a
        # lock after a bounded time instead of stalling their whole batch.
        self._writer_kwargs = dict(self._connect_kwargs, server_settings={
            **server_settings, "idle_in_transaction_session_timeout": "10s",
            "lock_timeout": "15s"})
        self._channel = notify_channel(schema)
        self._free: list[asyncpg.Connection] = []
        self._has_fn = True  # off if this role may not create temporary functions

    async def _connect_writer(self) -> asyncpg.Connection:
        conn = await asyncpg.connect(**self._writer_kwargs)
        if self._has_fn:
            try:
                await conn.execute(_CREATE_FN)
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

    async def _run_batch(self, batch):
        cached = self._plan_from_cache(batch)
        if cached is not None and len(cached.updated) > 1 and not self._has_fn:
            self._unplan(batch)
            cached = None
        async with self._writer_connection() as conn:
            stale = False
            if cached is not None:
                if await self._write_cached(conn, cached):
                    return cached
                # Nothing was written (the statement did nothing, or failed as a whole); the
                # connection is fine.
                self._unplan(batch)
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
            written = await conn.fetch(_APPEND_ONE, sid, v, h, e, t, ov, oh, oe,
                                       *_columns(plan.events)[1:], self._channel)
            return bool(written)
        try:
            await conn.execute(_CALL_FN, *_columns(plan.updated), *_columns(plan.events),
                               self._channel)
            return True
        except asyncpg.PostgresError as exc:
            if exc.sqlstate != _HEADS_MOVED:
                raise
            return False

    async def _plan_and_write(self, conn, batch):
        ids = sorted({r.stream_id for r in batch})
        heads = {row[0]: (row[1], row[2], row[3])
                 for row in await conn.fetch(_SELECT_HEADS, ids)}
        wanted = stored_hashes_wanted(batch)  # (only a retry wants any)
        stored = ({(row[0], row[1]): row[2]
                   for row in await conn.fetch(_SELECT_HASHES, *_columns(wanted))}
                  if wanted else None)
        plan = plan_batch(batch, heads, stored)
        if not plan.events:
            return plan
        if plan.created:
            inserted = await conn.fetch(_INSERT_STREAMS, *_columns(plan.created))
            if len(inserted) != len(plan.created):
                # Another writer created one of these streams since we looked.
                raise _RetryBatch()
        if plan.updated:  # rows locked FOR UPDATE above: they hold what was read
            await conn.execute(_UPDATE_STREAMS, *_columns([u[:5] for u in plan.updated]))
        await conn.execute(_INSERT_EVENTS, *_columns(plan.events), self._channel)
        return plan

    def _is_integrity_error(self, exc):
        return isinstance(exc, asyncpg.IntegrityConstraintViolationError)

    def _is_outage(self, exc):
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

    def _insert(self, table):
        return pg_insert(table)

    def _visible_to_tailing_readers(self):
        return events.c.tx_order < _as_bigint(func.pg_snapshot_xmin(func.pg_current_snapshot()))

    async def _close_dialect(self) -> None:
        free, self._free = self._free, []
        await asyncio.gather(*(_close_quickly(conn) for conn in free))

    @contextlib.asynccontextmanager
    async def _change_notifications(self):
        listener = _Listener(self)
        try:
            yield listener
        finally:
            await listener.close()


class _Listener:
    """LISTEN on the store's channel for one follower, kept up across outages.

    The connection dies with the server (a restart, a failover) or the network; nothing
    tells a follower waiting for a notification, which then only polls (a restart of a few
    seconds between two polls left followers on `poll_interval` for good). Losing it wakes
    the follower, and each `listening()` makes a new one if it is gone; a failure to
    connect is not the follower's error (its reads say whether the database is there):
    it polls, and tries again at its next wake-up."""

    def __init__(self, store: PostgresEventStore):
        self._store = store
        self._conn: asyncpg.Connection | None = None
        self._warned = False  # (once per outage)
        self._missed = False  # a connection was lost: notifications may have been missed

    async def listening(self) -> bool:
        if self._conn is not None and not self._conn.is_closed():
            return True
        self._drop()
        store = self._store
        try:
            conn = await asyncpg.connect(**store._connect_kwargs)
            try:
                # Bounded as the connect is: a network gone silent in between left the
                # follower in this LISTEN, neither reading nor raising, for the partition.
                await asyncio.wait_for(conn.add_listener(store._channel, self._on_notify),
                                       store._connect_kwargs["timeout"])
            except BaseException:
                conn.terminate()
                raise
        except Exception as exc:  # noqa: BLE001 - the follower polls meanwhile
            if not self._warned:
                log.warning("cannot LISTEN for new events (%s): polling until it can",
                            store._describe_outage(exc))
            self._warned = self._missed = True
            return False
        conn.add_termination_listener(self._on_lost)
        self._conn, self._warned = conn, False
        if self._missed:
            self._missed = False
            store._signal_change()  # what committed meanwhile was not notified: read again
        return True

    def _on_notify(self, *_args) -> None:
        self._store._signal_change()

    def _on_lost(self, _conn) -> None:
        self._missed = True
        self._store._signal_change()  # wake the follower: it connects again

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await _close_quickly(conn)


async def _close_quickly(conn: asyncpg.Connection) -> None:
    """Close politely if the server answers soon; a server behind a dead network never
    does (asyncpg waits for its end of the socket): then just drop the connection."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), CLOSE_WAIT_S)
    if not conn.is_closed():
        conn.terminate()
