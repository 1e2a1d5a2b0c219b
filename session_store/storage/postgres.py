"""PostgreSQL over asyncpg: several writer connections, row locks only, reader-safe order.

Positions come from an identity column, so two transactions can commit out of position order
and a reader that moves past a gap would miss the late one (the classic event-store gap).
Instead of serialising writers with a table lock, each row records its transaction id
(`tx_order`) and tailing readers see only rows whose transaction id is below the oldest
transaction still running (`pg_snapshot_xmin`): no transaction can later commit an event
that sorts before what a reader has already seen in (tx_order, position) order.

The hot path talks to asyncpg directly: each writer task owns one connection and writes a
whole batch with array parameters (`unnest`), a fixed number of round trips per batch.
"""

from __future__ import annotations

import contextlib
import re

import asyncpg
from sqlalchemy import BigInteger, Text, cast, func
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from ..schema import events, streams
from .base import SqlEventStore, _RetryBatch


def check_schema_name(schema: str) -> str:
    """A PostgreSQL schema name from configuration, checked: a plain identifier only (it goes
    into the search path, and a value like "a,b" or one with quotes would mean another)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", schema):
        raise ValueError(f"invalid schema name {schema!r}: use letters, digits and _ "
                         "(at most 63, not starting with a digit)")
    return schema


def _as_bigint(expr):
    return cast(cast(expr, Text), BigInteger)


_S, _E = streams.name, events.name
_SELECT_HEADS = (f"SELECT stream_id, version, last_hash, epoch FROM {_S} "
                 "WHERE stream_id = ANY($1::text[]) ORDER BY stream_id FOR UPDATE")
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


def _columns(rows: list[tuple]) -> list[list]:
    return [list(col) for col in zip(*rows)]


class PostgresEventStore(SqlEventStore):
    dialect_name = "postgresql"
    # Few writers, big batches: on a small machine more writers only means more transactions
    # competing with the server for the same CPUs (bench/concurrent_calls.py).
    default_writers = 2
    poll_interval = 0.5  # NOTIFY wakes followers at once; polling only covers a lost notify

    def __init__(self, url: str, *, schema: str | None = None, pool_size: int = 8, **kwargs):
        server_settings = {"synchronous_commit": "on", "application_name": "session_store"}
        if schema:
            server_settings["search_path"] = check_schema_name(schema)
        engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size,
                                     pool_pre_ping=True,
                                     connect_args={"server_settings": server_settings})
        super().__init__(engine, **kwargs)
        u = make_url(url)
        self._connect_kwargs = dict(host=u.host, port=u.port, user=u.username,
                                    password=u.password, database=u.database,
                                    server_settings=server_settings)
        # A writer frozen mid-batch (SIGSTOP, a paused VM) must not hold stream-head row
        # locks forever: the server ends its transaction, and waiting writers give up on a
        # lock after a bounded time instead of stalling their whole batch.
        self._writer_kwargs = dict(self._connect_kwargs, server_settings={
            **server_settings, "idle_in_transaction_session_timeout": "10s",
            "lock_timeout": "15s"})
        self._channel = f"session_store_{schema or 'public'}".lower()
        self._free: list[asyncpg.Connection] = []

    @contextlib.asynccontextmanager
    async def _writer_connection(self):
        """A dedicated connection per writer task, replaced when it breaks."""
        reused = bool(self._free)
        conn = self._free.pop() if self._free else await asyncpg.connect(**self._writer_kwargs)
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
        async with self._writer_connection() as conn, conn.transaction():
            ids = sorted({r.stream_id for r in batch})
            heads = {row[0]: (row[1], row[2], row[3])
                     for row in await conn.fetch(_SELECT_HEADS, ids)}
            plan = self._plan_batch(batch, heads)
            if not plan.events:
                return plan.outcomes
            if plan.created:
                inserted = await conn.fetch(_INSERT_STREAMS, *_columns(plan.created))
                if len(inserted) != len(plan.created):
                    # Another writer created one of these streams since we looked.
                    raise _RetryBatch()
            if plan.updated:
                await conn.execute(_UPDATE_STREAMS, *_columns(plan.updated))
            await conn.execute(_INSERT_EVENTS, *_columns(plan.events), self._channel)
            return plan.outcomes

    def _is_integrity_error(self, exc):
        return isinstance(exc, asyncpg.IntegrityConstraintViolationError)

    def _is_outage(self, exc):
        # Unreachable or refused (OSError), the connection lost mid-statement, the server
        # starting up or shutting down, restarting after a crash of one of its processes.
        return isinstance(exc, (OSError, ConnectionError, asyncpg.PostgresConnectionError,
                                asyncpg.InterfaceError, asyncpg.CannotConnectNowError,
                                asyncpg.AdminShutdownError, asyncpg.CrashShutdownError))

    def _insert(self, table):
        return pg_insert(table)

    def _visible_to_tailing_readers(self):
        return events.c.tx_order < _as_bigint(func.pg_snapshot_xmin(func.pg_current_snapshot()))

    async def _close_dialect(self) -> None:
        for conn in self._free:
            with contextlib.suppress(Exception):
                await conn.close()
        self._free.clear()

    @contextlib.asynccontextmanager
    async def _change_notifications(self):
        conn = await asyncpg.connect(**self._connect_kwargs)

        def on_notify(*_args) -> None:
            self._signal_change()

        await conn.add_listener(self._channel, on_notify)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await conn.close()
