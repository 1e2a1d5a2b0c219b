"""PostgreSQL over asyncpg: several writer connections, row locks only, reader-safe order.

The store's PostgreSQL dialect: its committer (committer.py), its followers' LISTEN
connection (listener.py), and PostgreSQL's answers to what the store asks (dialect.py one
level up). `postgres_store(url)` makes an unopened store on it.

Positions come from an identity column, so two transactions can commit out of position order
and a reader that moves past a gap would miss the late one (the classic event-store gap).
Instead of serialising writers with a table lock, each row records its transaction id
(`tx_order`) and tailing readers see only rows whose transaction id is below the oldest
transaction still running that may write to this log (`READERS_HORIZON`, statements.py):
no transaction can later commit an event that sorts before what a reader has already seen
in (tx_order, position) order.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re

import asyncpg

from sqlalchemy import BigInteger, Boolean, column, func, select, text, true, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from ...checks import check_count, check_seconds
from ...errors import CannotOpen
from ..schema import events, snapshots, streams
from ..store import SqlEventStore
from ..urls import SQLALCHEMY_ONLY_OPTIONS
from .committer import PostgresCommitter
from .listener import Listener, close_quickly
from .statements import READERS_HORIZON

# The horizon's one row: below it, rows no running writer of this log can precede.
_HORIZON = text(READERS_HORIZON).columns(column("horizon", BigInteger),
                                         column("unsettled", Boolean),
                                         column("xmax", BigInteger)).subquery("horizon")
# A safety net only: the reads an unsettled horizon may take are bounded anyway (read_page).
_SETTLING_READS = 100


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


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(getattr(exc, "orig", exc), "sqlstate", None)


class PostgresDialect:
    """PostgreSQL's part of a store (the `Dialect` protocol)."""

    name = "postgresql"
    # Few writers, big batches: on a small machine more writers only means more transactions
    # competing with the server for the same CPUs (bench/concurrent_calls.py).
    default_writers = 2
    poll_interval = 0.5  # NOTIFY wakes followers at once; polling only covers a lost notify
    lazy_facts = False  # see SqlEventStore.lazy_facts
    commits_urgent_inline = False

    def __init__(self, url: str, *, schema: str | None = None, pool_size: int = 8,
                 attempt_timeout: float | None = 5.0, read_timeout: float | None = 30.0,
                 read_only: bool = False):
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
        self.read_only = bool(read_only)
        self.engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size,
                                          pool_pre_ping=True,
                                          connect_args={"server_settings": server_settings,
                                                        "timeout": connect_timeout,
                                                        "command_timeout": read_timeout})
        # The writers' and the listener's own connections take the URL as SQLAlchemy's pool
        # does (its dialect's connect arguments): host, port and credentials, and the query's
        # options too (`?ssl=require`, `?host=/run/postgresql`). Built from the URL's parts
        # alone, they dropped the query: appends went in clear text where TLS was asked for,
        # or to the environment's default host.
        _args, params = self.engine.sync_engine.dialect.create_connect_args(make_url(url))
        for adaptor_only in SQLALCHEMY_ONLY_OPTIONS:
            params.pop(adaptor_only, None)
        self._connect_kwargs = dict(params, server_settings=server_settings,
                                    timeout=connect_timeout)
        self._channel = notify_channel(schema)
        self._schema = schema
        # A writer frozen mid-batch (SIGSTOP, a paused VM) must not hold stream-head row
        # locks forever: the server ends its transaction, and waiting writers give up on a
        # lock after a bounded time instead of stalling their whole batch.
        self.committer = PostgresCommitter(dict(self._connect_kwargs, server_settings={
            **server_settings, "idle_in_transaction_session_timeout": "10s",
            "lock_timeout": "15s"}), self._channel)

    async def open(self, check_schema) -> None:
        await check_schema()

    async def close(self) -> None:
        await self.committer.close()

    def is_missing_table(self, exc: BaseException) -> bool:
        return _sqlstate(exc) == "42P01"

    def is_denied(self, exc: BaseException) -> bool:
        return _sqlstate(exc) == "42501"

    async def why_no_schema(self, conn) -> str | None:
        if not self._schema:
            return None
        # A schema the role may not use is left out of the search path: its tables look
        # missing, and "run migrate" would be the wrong advice.
        usable = (await conn.execute(text(
            "SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace "
            "WHERE nspname = :name"), {"name": self._schema})).scalar()
        if usable is None:
            return (f"the schema {self._schema} does not exist in this database; create "
                    "it, then run `session-store migrate --db URL --schema "
                    f"{self._schema}`")
        if not usable:
            raise CannotOpen(f"the database role may not use the schema {self._schema}: "
                             "grant it the use of the schema (and reading its tables), or "
                             "connect as the role that ran migrate")
        return None

    async def check_append_privileges(self, conn) -> None:
        wanted = [(streams.name, "INSERT"), (streams.name, "UPDATE"), (events.name, "INSERT"),
                  (snapshots.name, "INSERT"), (snapshots.name, "UPDATE")]
        held = (await conn.execute(select(*(func.has_table_privilege(table, privilege)
                                            for table, privilege in wanted)))).one()
        missing = [f"{p} on {t}" for (t, p), ok in zip(wanted, held) if not ok]
        if missing:
            raise CannotOpen(f"the database role may read the session store but not append to "
                             f"it (no {', '.join(missing)}): grant them, connect as the role "
                             "that ran migrate, or open the store read_only")

    def insert(self, table):
        return pg_insert(table)

    def global_order(self):
        # (tx_order, position): concurrent writers commit out of position order.
        return events.c.tx_order, events.c.position

    def page_statement(self, columns, cursor, cursor_order, limit):
        # Rows after the cursor that no running writer of this log can precede, joined
        # outward from the horizon's one row: even an empty page says whether the horizon
        # was settled. (LATERAL keeps the page an ordered index scan that stops at `limit`.)
        after = (tuple_(events.c.tx_order, events.c.position)
                 > tuple_(func.coalesce(cursor_order, -1), cursor))
        page = (select(events.c.tx_order.label("tail_order"),
                       events.c.position.label("tail_position"), *columns)
                .where(after, events.c.tx_order < _HORIZON.c.horizon)
                .order_by(*self.global_order()).limit(limit).lateral())
        return (select(_HORIZON.c.unsettled, _HORIZON.c.horizon, _HORIZON.c.xmax, page)
                .select_from(_HORIZON.outerjoin(page, true()))
                .order_by(page.c.tail_order, page.c.tail_position))

    async def read_page(self, conn, stmt, params, limit):
        # An unsettled horizon is read again until it settles or is set by a transaction
        # that began after the first read did (what it holds back committed after that
        # read began). Each read again passes one that ended, and only the first read's
        # running transactions can be such: the reads are bounded by their number.
        began = None
        for _ in range(_SETTLING_READS):
            rows = (await conn.execute(stmt, params)).all()
            unsettled, horizon, xmax = rows[0][:3]
            began = xmax if began is None else began
            found = [tuple(row[5:]) for row in rows if row[4] is not None]
            if not unsettled or horizon >= began or len(found) == limit:
                break
        return found

    async def probe(self, timeout: float) -> None:
        """Raise (the driver's error, or TimeoutError) unless the server answers a new
        connection's query within `timeout` seconds: the pool's may all be hung."""
        async with asyncio.timeout(timeout):
            conn = await asyncpg.connect(**dict(self._connect_kwargs, timeout=timeout))
            try:
                await conn.fetchval("SELECT 1")
            finally:
                await close_quickly(conn)

    @contextlib.asynccontextmanager
    async def change_notifications(self, on_change):
        listener = Listener(self._connect_kwargs, self._channel, on_change)
        try:
            yield listener
        finally:
            await listener.close()


def postgres_store(url: str, *, schema: str | None = None, pool_size: int = 8,
                   attempt_timeout: float | None = 5.0, read_timeout: float | None = 30.0,
                   read_only: bool = False, **options) -> SqlEventStore:
    """An unopened store on the PostgreSQL database at `url` (`open_store` opens it);
    `options` are the store's (`SqlEventStore`). The commits' `attempt_timeout` also bounds
    each connect."""
    dialect = PostgresDialect(url, schema=schema, pool_size=pool_size,
                              attempt_timeout=attempt_timeout, read_timeout=read_timeout,
                              read_only=read_only)
    return SqlEventStore(dialect, attempt_timeout=attempt_timeout, **options)
