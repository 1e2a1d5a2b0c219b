"""SQLite: one writer thread over the plain sqlite3 driver, WAL with synchronous=FULL.

SQLite has one writer at a time, so group commit here means one writer task that takes every
queued append into one BEGIN IMMEDIATE … COMMIT. The batch runs on a dedicated thread with
statements compiled once from the Core tables: one thread hop per batch, no per-statement
SQLAlchemy overhead on the hot path. Reads go through SQLAlchemy over aiosqlite.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import bindparam, event, literal_column, select, update
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from ..schema import events, streams
from .base import SqlEventStore

BUSY_TIMEOUT_MS = 5000

# What a database that cannot take writes for now answers (locked past busy_timeout, disk
# full, read-only, I/O error, cannot open): the append is retried until its deadline. Any
# other error (no such table, a constraint, ...) is a bug and raised at once.
_OUTAGE_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_NOMEM,
                           sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL,
                           sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL})
# After these the writer connection itself may be what stays broken: a connection reopened
# while the file was unwritable is read-only for good (SQLite falls back to O_RDONLY), so
# every append failed until the store was reopened, long after the file was writable again
# (tests/faults/test_db_outage.py). The next try opens a new connection.
_REOPEN_CODES = frozenset({sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR,
                           sqlite3.SQLITE_CANTOPEN})


def _primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _sql(stmt) -> str:
    return str(stmt.compile(dialect=sqlite_dialect.dialect(paramstyle="qmark")))


# One statement for all the batch's stream heads (fewer GIL hand-offs on the writer thread).
_SELECT_HEADS = (f"SELECT stream_id, version, last_hash, epoch FROM {streams.name} "
                 "WHERE stream_id IN ({marks})")
_INSERT_STREAM = _sql(streams.insert().values(
    stream_id=bindparam("s"), version=bindparam("v"), last_hash=bindparam("h"),
    epoch=bindparam("e"), created_at_us=bindparam("t"), updated_at_us=bindparam("t2")))
_UPDATE_STREAM = _sql(update(streams).where(streams.c.stream_id == bindparam("s")).values(
    version=bindparam("v"), last_hash=bindparam("h"), epoch=bindparam("e"),
    updated_at_us=bindparam("t")))
_INSERT_EVENT = _sql(events.insert().values(
    tx_order=literal_column("0"), stream_id=bindparam("s"), version=bindparam("v"), type=bindparam("ty"),
    schema_version=bindparam("sv"), data=bindparam("d"), recorded_at_us=bindparam("t"),
    hash=bindparam("h")))


def _configure(dbapi_conn) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # FULL: a commit survives power loss, not only a process crash (NORMAL would not).
    cur.execute("PRAGMA synchronous=FULL")
    cur.close()


class SqliteEventStore(SqlEventStore):
    dialect_name = "sqlite"
    default_writers = 1  # SQLite has one writer; more tasks would only queue on its lock
    poll_interval = 0.1  # other processes cannot notify us: poll

    def __init__(self, url: str, **kwargs):
        self._path = make_url(url).database
        if not self._path or self._path == ":memory:":
            raise ValueError("the SQLite store needs a file (sqlite+aiosqlite:///path.db): "
                             "durability and other processes need one")
        engine = create_async_engine(url)
        event.listen(engine.sync_engine, "connect", lambda c, _r: _configure(c))
        super().__init__(engine, **kwargs)
        self._writer_thread = ThreadPoolExecutor(1, thread_name_prefix="session-store-sqlite")
        self._conn: sqlite3.Connection | None = None

    # Everything below `_run_batch` runs on the writer thread only.
    def _writer_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the write lock is
            # held from the head check to the commit.
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            _configure(conn)
            self._conn = conn
        return self._conn

    def _run_batch_sync(self, batch):
        conn = self._writer_conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            ids = sorted({r.stream_id for r in batch})
            heads = {}
            for chunk in range(0, len(ids), 500):  # SQLite's bound-parameter limit
                part = ids[chunk:chunk + 500]
                sql = _SELECT_HEADS.format(marks=",".join("?" * len(part)))
                heads.update((row[0], row[1:]) for row in conn.execute(sql, part))
            plan = self._plan_batch(batch, heads)
            if plan.events:
                if plan.created:
                    conn.executemany(_INSERT_STREAM, [(s, v, h, e, t, t)
                                                      for s, v, h, e, t in plan.created])
                if plan.updated:
                    conn.executemany(_UPDATE_STREAM, [(v, h, e, t, s)
                                                      for s, v, h, e, t in plan.updated])
                conn.executemany(_INSERT_EVENT, plan.events)
            conn.execute("COMMIT")
            return plan.outcomes
        except BaseException as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    self._drop_conn()
            else:
                self._drop_conn()
            if _primary_code(exc) in _REOPEN_CODES:
                self._drop_conn()
            raise

    def _drop_conn(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    async def _run_batch(self, batch):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer_thread, self._run_batch_sync, batch)

    def _is_integrity_error(self, exc):
        return isinstance(exc, sqlite3.IntegrityError)

    def _is_outage(self, exc):
        if not isinstance(exc, sqlite3.OperationalError):
            return False
        code = _primary_code(exc)
        return code is None or code in _OUTAGE_CODES

    def _describe_outage(self, exc):
        name = getattr(exc, "sqlite_errorname", None)
        return f"{super()._describe_outage(exc)}{f' ({name})' if name else ''}"

    def _insert(self, table):
        return sqlite_insert(table)

    async def _close_dialect(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer_thread, self._drop_conn)
        self._writer_thread.shutdown(wait=True)
