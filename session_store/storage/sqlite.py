"""SQLite: one writer at a time over the plain sqlite3 driver, WAL with synchronous=FULL.

SQLite has one writer at a time, so group commit here means one writer task that takes every
queued append into one transaction, on a dedicated thread with statements compiled once from
the Core tables. A batch planned from cached stream heads (the usual case) is one INSERT into
a temporary view whose trigger checks and writes each head (see _APPEND_VIEW): the whole
transaction is one sqlite3 call; otherwise BEGIN IMMEDIATE, the heads read under the lock,
the writes, COMMIT. Reads go through SQLAlchemy over aiosqlite.

Opt-in (`inline="urgent"` or `"always"`): an append that finds the store idle (nothing
queued or committing) commits inline instead, on the event loop's thread over a second
connection: on a fast disk the two thread hand-offs of the writer-thread path cost more than
the commit itself (bench/append_floor.py), and while the loop is busy the writer thread waits
for the GIL after each sqlite3 call (1-7 ms per commit in a live call). "urgent" does this
only for appends marked urgent (the service marks the two a tool call waits for: its start,
its result with the send intent). Inline blocks the loop, and the audio of every call on it,
for each fsync, so it is off by default: through the writer thread a disk that stalls delays
a tool call, inline it would stall the audio of every call on the loop. An inline commit
first gives the loop one turn (the store's append), so the audio already pushed goes out
before the loop blocks. "always" suits a process that appends for one stream and has nothing
else on its loop. Where it is on, it is only used where the stall stays small:
- while the store serves one stream (one call): if another stream was appended to in the last
  `_SHARED_QUIET_S`, every append goes to the writer thread. With n calls on a loop, inline
  commits would come n times as often and each would hold up n calls' audio; group commit on
  the thread keeps fsyncs off the loop (bench/concurrent_calls.py);
- that connection never waits for SQLite's lock (busy_timeout=0): if another process holds
  it, the append goes to the writer thread, which waits;
- it never checkpoints the WAL (wal_autocheckpoint=0); the writer thread does, every
  `_CHECKPOINT_EVERY` inline commits, and appends go to the writer thread (queued behind the
  checkpoint) until it is done: a checkpoint racing a stream of commits never catches up, the
  WAL file then grows without end and every fsync gets slower;
- commits slower than `inline_budget` seconds (a slow or busy disk) stop inline commits for a
  while (1 s, doubling while it stays slow, at most 60 s): two within 13 commits, or one ten
  times over budget. A single slow fsync is noise on a shared machine; a disk that is
  slow every time is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import bindparam, event, literal_column, update
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from ..schema import events, streams
from .base import SqlEventStore
from .batch import BatchPlan, _AppendRequest

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
# Inline commits between two WAL checkpoints (by the writer thread). One event dirties ~4
# pages, so this is about SQLite's own default of 1000 WAL pages.
_CHECKPOINT_EVERY = 250
_PAUSE_MIN_S, _PAUSE_MAX_S = 1.0, 60.0
# Per inline commit an old slow commit counts less: two slow ones within 13 commits pause.
_SLOW_DECAY = 0.95
_SLOW_LIMIT = 1.5
_FAST_RUN_RESET = 200  # this many commits in budget in a row: the pause starts at 1 s again
_SHARED_QUIET_S = 1.0  # another stream appended to this recently: the store is shared

# What a database that cannot take writes for now answers (locked past busy_timeout, disk
# full, read-only, I/O error, cannot open): the append is retried until its deadline. Any
# other error (no such table, a constraint, ...) is a bug and raised at once.
_OUTAGE_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_NOMEM,
                           sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL,
                           sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL})


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
# Conditional: the row must still hold the head the batch was planned from (a cached head
# another store moved updates nothing, and the batch is planned again).
_UPDATE_STREAM = _sql(update(streams).where(
    streams.c.stream_id == bindparam("s"), streams.c.version == bindparam("ov"),
    streams.c.last_hash == bindparam("oh"), streams.c.epoch == bindparam("oe")).values(
    version=bindparam("v"), last_hash=bindparam("h"), epoch=bindparam("e"),
    updated_at_us=bindparam("t")))
_INSERT_EVENT = _sql(events.insert().values(
    tx_order=literal_column("0"), stream_id=bindparam("s"), version=bindparam("v"), type=bindparam("ty"),
    schema_version=bindparam("sv"), data=bindparam("d"), recorded_at_us=bindparam("t"),
    hash=bindparam("h")))


# A batch planned from cached heads commits as one INSERT into this temporary view, whose
# INSTEAD OF trigger checks each event against its stream's head row (version, last hash,
# epoch: the conditional update of the transactional path) and writes both; a head that
# moved aborts the statement, and nothing is written. Why one statement: each sqlite3 call
# releases the GIL, and while the event loop is busy (the audio of a live call) the writer
# thread waits up to the switch interval (5 ms) to take it back: BEGIN, UPDATE, INSERT,
# COMMIT were four waits, the fsync's among them. Temporary objects live in the connection,
# so this needs no migration (as the PostgreSQL writer's temporary function).
_APPEND_VIEW = "session_store_append"
_APPEND_COLUMNS = ("stream_id", "version", "type", "schema_version", "data", "recorded_at_us",
                   "hash", "prev_hash", "expect_epoch", "epoch")
_HEAD_MOVED = "session_store: stream head moved"
_CREATE_APPEND_VIEW = (f"CREATE TEMP VIEW IF NOT EXISTS {_APPEND_VIEW} AS SELECT "
                       + ", ".join(f"NULL AS {c}" for c in _APPEND_COLUMNS))
_CREATE_APPEND_TRIGGER = f"""
CREATE TEMP TRIGGER IF NOT EXISTS {_APPEND_VIEW}_insert INSTEAD OF INSERT ON {_APPEND_VIEW}
BEGIN
    SELECT RAISE(ABORT, '{_HEAD_MOVED}') WHERE NOT EXISTS (
        SELECT 1 FROM {streams.name} WHERE stream_id = NEW.stream_id
        AND version = NEW.version - 1 AND last_hash = NEW.prev_hash
        AND epoch = NEW.expect_epoch);
    UPDATE {streams.name} SET version = NEW.version, last_hash = NEW.hash, epoch = NEW.epoch,
        updated_at_us = NEW.recorded_at_us WHERE stream_id = NEW.stream_id;
    INSERT INTO {events.name} (tx_order, stream_id, version, type, schema_version, data,
                               recorded_at_us, hash)
    VALUES (0, NEW.stream_id, NEW.version, NEW.type, NEW.schema_version, NEW.data,
            NEW.recorded_at_us, NEW.hash);
END"""


def _bound_parameter_limit() -> int:
    conn = sqlite3.connect(":memory:")
    try:
        return conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)  # 32766 since SQLite 3.32
    finally:
        conn.close()


# Rows that fit one statement's bound parameters; a bigger batch takes the transactional path.
_MAX_ROWS_PER_STATEMENT = _bound_parameter_limit() // len(_APPEND_COLUMNS)


@functools.lru_cache(maxsize=128)
def _append_sql(rows: int) -> str:
    marks = "(" + ",".join("?" * len(_APPEND_COLUMNS)) + ")"
    return f"INSERT INTO temp.{_APPEND_VIEW} VALUES " + ",".join([marks] * rows)


def _install_append_view(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA temp_store=MEMORY")  # the view and trigger: no temporary file
    conn.execute(_CREATE_APPEND_VIEW)
    conn.execute(_CREATE_APPEND_TRIGGER)


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection):
    """BEGIN IMMEDIATE (the write lock from the start); rolled back if the body raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the caller drops this connection
        raise


def _configure(dbapi_conn, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")  # PRAGMA takes no parameters
    # FULL: a commit survives power loss, not only a process crash (NORMAL would not).
    cur.execute("PRAGMA synchronous=FULL")
    cur.close()


def _is_busy(exc: BaseException) -> bool:
    return (isinstance(exc, sqlite3.OperationalError)
            and getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY)


class SqliteEventStore(SqlEventStore):
    dialect_name = "sqlite"
    default_writers = 1  # SQLite has one writer; more tasks would only queue on its lock
    poll_interval = 0.1  # other processes cannot notify us: poll

    def __init__(self, url: str, *, inline: str = "never", inline_budget: float = 0.002,
                 **kwargs):
        """`inline`: which appends that find the store idle, serving one stream, may commit
        on the event loop's thread: "never" (the default: every commit on the writer
        thread), "urgent" ones (`append(urgent=True)`: an append the caller acts on at once,
        such as a tool's start or a result about to be sent), or "always". `inline_budget`:
        the longest inline commit (seconds) tolerated before inline commits pause (0.002
        suits a local SSD); 0 turns them off."""
        if inline not in ("urgent", "always", "never"):
            raise ValueError(f"inline must be 'urgent', 'always' or 'never', not {inline!r}")
        if inline == "never":
            inline_budget = 0.0
        self._path = make_url(url).database
        if not self._path or self._path == ":memory:":
            raise ValueError("the SQLite store needs a file (sqlite+aiosqlite:///path.db): "
                             "durability and other processes need one")
        engine = create_async_engine(url)
        event.listen(engine.sync_engine, "connect", lambda c, _r: _configure(c))
        super().__init__(engine, **kwargs)
        self._writer_thread = ThreadPoolExecutor(1, thread_name_prefix="session-store-sqlite")
        self._conn: sqlite3.Connection | None = None  # the writer thread's
        self._inline_budget = inline_budget
        self._inline_urgent_only = inline == "urgent"
        self.commits_urgent_inline = inline_budget > 0
        self._inline_conn: sqlite3.Connection | None = None  # the event loop thread's
        self._inline_paused_until = 0.0
        self._inline_pause = _PAUSE_MIN_S
        self._slow_score = 0.0
        self._fast_run = 0
        self._last_stream: str | None = None
        self._last_stream_at = 0.0
        self._shared_until = 0.0
        self._inline_since_checkpoint = 0
        self._checkpointing = False

    async def _prepare_dialect(self) -> None:
        # Both connections are opened on the writer thread: opening sets WAL mode (persistent
        # in the file) and may wait for a lock, which the loop must not.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer_thread, self._prepare_connections)

    def _prepare_connections(self) -> None:
        self._writer_conn()
        self._open_inline()

    def _open_inline(self) -> None:
        if self._inline_budget > 0 and self._inline_conn is None:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            _configure(conn, busy_timeout_ms=0)
            conn.execute("PRAGMA wal_autocheckpoint=0")
            _install_append_view(conn)
            self._inline_conn = conn

    # ------------------------------------------------------------------ one batch (any thread)
    def _commit_sync(self, conn: sqlite3.Connection, batch: list[_AppendRequest],
                     cached: BatchPlan | None) -> BatchPlan:
        """Commit a batch: the cached plan if its heads still hold, else a plan from the
        heads read under the write lock."""
        if cached is not None:
            if self._commit_planned(conn, cached):
                return cached
            self._unplan(batch)  # another store moved a head: nothing was written
        with _immediate(conn):
            plan = self._plan_batch(batch, self._read_heads(conn, batch))
            plan.stale = cached is not None
            if not self._write_plan(conn, plan):
                raise RuntimeError("a stream head row changed under SQLite's write lock")
            conn.execute("COMMIT")
        return plan

    @staticmethod
    def _commit_planned(conn: sqlite3.Connection, plan: BatchPlan) -> bool:
        """Commit a plan made from cached heads; False (nothing written) if a head moved.

        In one statement (see _APPEND_VIEW) when it fits: no transaction of ours is open, so
        SQLite runs it as its own transaction, from taking the write lock to the fsync of
        the commit, inside one sqlite3 call."""
        if len(plan.events) > _MAX_ROWS_PER_STATEMENT:  # (a plan from the cache creates none)
            with _immediate(conn):  # a huge batch: the conditional writes
                moved = not SqliteEventStore._write_plan(conn, plan)
                conn.execute("ROLLBACK" if moved else "COMMIT")
            return not moved
        # stream -> (old hash, old epoch, new epoch), from plan.updated's rows
        # (stream, version, hash, epoch, at, old version, old hash, old epoch)
        olds = {row[0]: (row[6], row[7], row[3]) for row in plan.updated}
        params: list = []
        prev_hash: dict[str, str] = {}
        for sid, version, etype, schema_version, data, at_us, h in plan.events:
            old_hash, old_epoch, epoch = olds[sid]
            prev = prev_hash.get(sid)
            params += (sid, version, etype, schema_version, data, at_us, h,
                       old_hash if prev is None else prev,
                       old_epoch if prev is None else epoch, epoch)
            prev_hash[sid] = h
        try:
            conn.execute(_append_sql(len(plan.events)), params)
        except sqlite3.IntegrityError as exc:
            if str(exc) != _HEAD_MOVED:
                raise
            return False
        return True

    @staticmethod
    def _read_heads(conn: sqlite3.Connection, batch: list[_AppendRequest]) -> dict:
        ids = sorted({r.stream_id for r in batch})
        heads = {}
        for chunk in range(0, len(ids), 500):  # SQLite's bound-parameter limit
            part = ids[chunk:chunk + 500]
            sql = _SELECT_HEADS.format(marks=",".join("?" * len(part)))
            heads.update((row[0], row[1:]) for row in conn.execute(sql, part))
        return heads

    @staticmethod
    def _write_plan(conn: sqlite3.Connection, plan: BatchPlan) -> bool:
        """Write a plan's rows; False (some rows may be written) if a head row moved."""
        if not plan.events:
            return True
        if plan.created:
            conn.executemany(_INSERT_STREAM, [(s, v, h, e, t, t)
                                              for s, v, h, e, t in plan.created])
        if plan.updated:
            cur = conn.executemany(_UPDATE_STREAM, [(v, h, e, t, s, ov, oh, oe)
                                                    for s, v, h, e, t, ov, oh, oe in plan.updated])
            if cur.rowcount != len(plan.updated):
                return False
        conn.executemany(_INSERT_EVENT, plan.events)
        return True

    # ------------------------------------------------------------------ writer thread
    def _writer_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the write lock is
            # held from the head check to the commit.
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            _configure(conn)
            _install_append_view(conn)
            self._conn = conn
        return self._conn

    def _run_batch_sync(self, batch, cached):
        try:
            return self._commit_sync(self._writer_conn(), batch, cached)
        except BaseException:
            # Whatever failed, the next try opens a new connection: one reopened while the
            # file was unwritable stays read-only for good (tests/faults/test_db_outage.py).
            self._drop_conn()
            raise
        finally:
            if self._inline_conn is None and not self._closed:
                try:  # the inline connection broke earlier: this thread may block, reopen it
                    self._open_inline()
                except sqlite3.Error:
                    log.warning("cannot reopen the inline SQLite connection", exc_info=True)

    def _drop_conn(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    async def _run_batch(self, batch):
        loop = asyncio.get_running_loop()
        cached = self._plan_from_cache(batch)
        return await loop.run_in_executor(self._writer_thread, self._run_batch_sync, batch,
                                          cached)

    def _checkpoint_sync(self) -> None:
        try:
            self._writer_conn().execute("PRAGMA main.wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            log.warning("WAL checkpoint failed; the next one retries", exc_info=True)
            self._drop_conn()
        finally:
            self._checkpointing = False

    # ------------------------------------------------------------------ inline (loop thread)
    def _inline_ready(self, stream_id: str, urgent: bool) -> bool:
        now = time.monotonic()
        if stream_id != self._last_stream:
            if now - self._last_stream_at < _SHARED_QUIET_S:
                self._shared_until = now + _SHARED_QUIET_S  # several calls: keep off the loop
            self._last_stream = stream_id
        self._last_stream_at = now
        if self._inline_urgent_only and not urgent:
            return False
        return (self._inline_conn is not None and not self._closed and not self._checkpointing
                and now >= self._inline_paused_until and now >= self._shared_until)

    def _append_inline(self, request):
        conn, batch = self._inline_conn, [request]
        cached = self._plan_from_cache(batch)
        started = time.monotonic()
        try:
            plan = self._commit_sync(conn, batch, cached)
        except Exception as exc:  # noqa: BLE001 - the writer thread retries and reports it
            self._forget_heads(batch)
            if _is_busy(exc):  # another process writes: leave the lock to the writer thread
                self._inline_paused_until = time.monotonic() + 0.05
            else:
                log.warning("inline commit failed (%s); handing over to the writer thread", exc)
                self._inline_conn = None  # reopened by the writer thread
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            return None
        self._judge_inline(time.monotonic() - started)
        self._remember_heads(batch, plan)
        self.stats["batches"] += 1
        self.stats["inline"] += 1
        self.stats["events"] += len(request.rows)
        self._inline_since_checkpoint += 1
        if self._inline_since_checkpoint >= _CHECKPOINT_EVERY and not self._checkpointing:
            self._inline_since_checkpoint = 0
            self._checkpointing = True
            self._writer_thread.submit(self._checkpoint_sync)
        return plan.outcomes[0]

    def _judge_inline(self, took: float) -> None:
        """Pause inline commits when they keep blocking the loop longer than the budget."""
        budget = self._inline_budget
        slow = (took > budget) + (took > 10 * budget)
        self._slow_score = self._slow_score * _SLOW_DECAY + slow
        if not slow:
            self._fast_run += 1
            if self._fast_run >= _FAST_RUN_RESET:
                self._inline_pause = _PAUSE_MIN_S
            return
        self._fast_run = 0
        if self._slow_score >= _SLOW_LIMIT:
            self._slow_score = 0.0
            self._inline_paused_until = time.monotonic() + self._inline_pause
            log.info("inline commits over budget (last %.1f ms, budget %.1f ms): writer thread "
                     "for %.0f s", took * 1e3, budget * 1e3, self._inline_pause)
            self._inline_pause = min(self._inline_pause * 2, _PAUSE_MAX_S)

    # ------------------------------------------------------------------ errors, close
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

    def _close_inline(self) -> None:
        conn, self._inline_conn = self._inline_conn, None
        if conn is not None:
            conn.close()

    async def _close_dialect(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer_thread, self._close_inline)
        await loop.run_in_executor(self._writer_thread, self._drop_conn)
        self._writer_thread.shutdown(wait=True)
