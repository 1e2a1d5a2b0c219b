"""SQLite: one writer at a time over the plain sqlite3 driver, WAL with synchronous=FULL.

SQLite has one writer at a time, so group commit here means one writer task that takes every
queued append into one transaction, committed by a writer process of the store's own
(`sqlite_writer`: a thread would wait for the GIL of a busy event loop) with statements
compiled once from the Core tables (`sqlite_commit` commits). Reads go through SQLAlchemy
over aiosqlite.

Opt-in (`inline="urgent"` or `"always"`): an append that finds the store idle (nothing
queued or committing) commits inline instead, on the event loop's thread over a second
connection: on a fast disk the two process hand-offs of the writer path cost more than the
commit itself (bench/append_floor.py). "urgent" does this
only for appends marked urgent (the service marks the two a tool call waits for: its start,
its result with the send intent). Inline blocks the loop, and the audio of every call on it,
for each fsync, so it is off by default: through the writer a disk that stalls delays a
tool call, inline it would stall the audio of every call on the loop. An inline commit
first gives the loop one turn (the store's append), so the audio already pushed goes out
before the loop blocks. "always" suits a process that appends for one stream and has nothing
else on its loop. Where it is on, it is only used where the stall stays small:
- while the store serves one stream (one call): if another stream was appended to in the last
  `_SHARED_QUIET_S`, every append goes to the writer. With n calls on a loop, inline
  commits would come n times as often and each would hold up n calls' audio; group commit in
  the writer keeps fsyncs off the loop (bench/concurrent_calls.py);
- that connection never waits for SQLite's lock (busy_timeout=0): if another process holds
  it, the append goes to the writer, which waits;
- it never checkpoints the WAL (wal_autocheckpoint=0); the writer does, every
  `_CHECKPOINT_EVERY` inline commits, and appends go to the writer (queued behind the
  checkpoint) until it is done: a checkpoint racing a stream of commits never catches up, the
  WAL file then grows without end and every fsync gets slower;
- commits slower than `inline_budget` seconds (a slow or busy disk) stop inline commits for a
  while (1 s, doubling while it stays slow, at most 60 s): two within 13 commits, or one ten
  times over budget. A single slow fsync is noise on a shared machine; a disk that is
  slow every time is not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
import urllib.parse

from sqlalchemy import bindparam, event, literal_column, select, update
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from ..errors import SchemaMismatch
from ..schema import events, streams
from . import sqlite_commit
from ..checks import check_seconds
from .base import SqlEventStore
from .sqlite_commit import APPEND_COLUMNS, APPEND_VIEW, HEAD_MOVED, Statements, commit_batch
from .sqlite_writer import WriterProcess

log = logging.getLogger(__name__)

# Inline commits between two WAL checkpoints (by the writer). One event dirties ~4 pages,
# so this is about SQLite's own default of 1000 WAL pages.
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


# Rows that fit one statement's bound parameters; a bigger batch takes the transactional path.
_MAX_ROWS_PER_STATEMENT = sqlite_commit.bound_parameter_limit() // len(APPEND_COLUMNS)


# The one-statement append: a batch planned from cached heads is one INSERT into this
# temporary view, whose INSTEAD OF trigger checks each event against its stream's head row
# (version, last hash, epoch: the conditional update of the transactional path) and writes
# both; a head that moved aborts the statement, and nothing is written. One statement is one
# transaction from the write lock to the fsync in one sqlite3 call (on the loop's thread,
# inline, one call instead of four). Temporary objects live in the connection: no migration
# (as the PostgreSQL writer's temporary function).
_CREATE_APPEND_VIEW = (f"CREATE TEMP VIEW IF NOT EXISTS {APPEND_VIEW} AS SELECT "
                       + ", ".join(f"NULL AS {c}" for c in APPEND_COLUMNS))
_CREATE_APPEND_TRIGGER = f"""
CREATE TEMP TRIGGER IF NOT EXISTS {APPEND_VIEW}_insert INSTEAD OF INSERT ON {APPEND_VIEW}
BEGIN
    SELECT RAISE(ABORT, '{HEAD_MOVED}') WHERE NOT EXISTS (
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
# One statement for all the batch's stream heads.
_SELECT_HEADS = (f"SELECT stream_id, version, last_hash, epoch FROM {streams.name} "
                 "WHERE stream_id IN ({marks})")


def _statements() -> Statements:
    """The commit's SQL, compiled from the Core tables."""
    return Statements(
        select_heads=_SELECT_HEADS,
        select_hash=_sql(select(events.c.hash).where(events.c.stream_id == bindparam("s"),
                                                     events.c.version == bindparam("v"))),
        append_view=(_CREATE_APPEND_VIEW, _CREATE_APPEND_TRIGGER),
        insert_stream=_sql(streams.insert().values(
            stream_id=bindparam("s"), version=bindparam("v"), last_hash=bindparam("h"),
            epoch=bindparam("e"), created_at_us=bindparam("t"), updated_at_us=bindparam("t2"))),
        # Conditional: the row must still hold the head the batch was planned from (a cached
        # head another store moved updates nothing, and the batch is planned again).
        update_stream=_sql(update(streams).where(
            streams.c.stream_id == bindparam("s"), streams.c.version == bindparam("ov"),
            streams.c.last_hash == bindparam("oh"), streams.c.epoch == bindparam("oe")).values(
            version=bindparam("v"), last_hash=bindparam("h"), epoch=bindparam("e"),
            updated_at_us=bindparam("t"))),
        insert_event=_sql(events.insert().values(
            tx_order=literal_column("0"), stream_id=bindparam("s"), version=bindparam("v"),
            type=bindparam("ty"), schema_version=bindparam("sv"), data=bindparam("d"),
            recorded_at_us=bindparam("t"), hash=bindparam("h"))),
        max_rows_per_statement=_MAX_ROWS_PER_STATEMENT)


def _is_busy(exc: BaseException) -> bool:
    return (isinstance(exc, sqlite3.OperationalError)
            and getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY)


class SqliteEventStore(SqlEventStore):
    dialect_name = "sqlite"
    default_writers = 1  # SQLite has one writer; more tasks would only queue on its lock
    poll_interval = 0.1  # other processes cannot notify us: poll
    lazy_facts = True  # see SqlEventStore.lazy_facts

    def _after_cursor(self, cursor_order, from_position: int):
        # One writer at a time commits in position order (tx_order is always 0 here): the
        # global order is the primary key's. SQLite has no (tx_order, position) index
        # (migration 0002: it cost a quarter of every commit), so this must not sort by it.
        return events.c.position > from_position, (events.c.position,)

    def __init__(self, url: str, *, inline: str = "never", inline_budget: float = 0.002,
                 **kwargs):
        """`inline`: which appends that find the store idle, serving one stream, may commit
        on the event loop's thread: "never" (the default: every commit in the writer
        process), "urgent" ones (`append(urgent=True)`: an append the caller acts on at once,
        such as a tool's start or a result about to be sent), or "always". `inline_budget`:
        the longest inline commit (seconds) tolerated before inline commits pause (0.002
        suits a local SSD); 0 turns them off."""
        if inline not in ("urgent", "always", "never"):
            raise ValueError(f"inline must be 'urgent', 'always' or 'never', not {inline!r}")
        check_seconds("inline_budget", inline_budget, zero_ok=True)
        if inline == "never":
            inline_budget = 0.0
        self._path = make_url(url).database
        if not self._path or self._path == ":memory:":
            raise ValueError("the SQLite store needs a file (sqlite+aiosqlite:///path.db): "
                             "durability and other processes need one")
        # Reads open the file read-write, never create it (`mode=rw`, as the writer does): a
        # read connection opened after the database was removed created a new, empty one at
        # the path ("no such table" for every read and append after it) instead of failing
        # as an outage (SQLITE_CANTOPEN).
        engine = create_async_engine(make_url(url).set(
            database=f"file:{urllib.parse.quote(os.path.abspath(self._path))}"
        ).update_query_dict({"mode": "rw", "uri": "true"}))
        event.listen(engine.sync_engine, "connect", lambda c, _r: sqlite_commit.configure(c))
        super().__init__(engine, **kwargs)
        self._statements = _statements()
        self._writer = WriterProcess(self._path, self._statements)
        self._writer_started: asyncio.Future | None = None
        self._reopening = asyncio.Lock()
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
        self._checkpoint_task: asyncio.Task | None = None

    async def _check_schema(self) -> None:
        if not os.path.exists(self._path) and os.path.isdir(os.path.dirname(
                os.path.abspath(self._path))):
            # (Not created here: `migrate` creates it.)
            raise SchemaMismatch(
                "the database file does not exist, so it has no session store schema; run "
                "`session-store migrate --db URL` (alembic upgrade head) first")
        # The writer process starts (0.15 s, mostly its imports) while the schema is checked.
        self._writer_started = asyncio.ensure_future(self._writer.start())
        try:
            await super()._check_schema()
        except BaseException:
            await asyncio.gather(self._writer_started, return_exceptions=True)
            raise

    async def _prepare_dialect(self) -> None:
        # The writer process opens its connection first: that sets WAL mode (persistent in
        # the file) and may wait for a lock, which the loop must not; so may the inline one.
        await self._writer_started
        await asyncio.get_running_loop().run_in_executor(None, self._open_inline)

    def _open_inline(self) -> None:
        if self._inline_budget > 0 and self._inline_conn is None:
            self._inline_conn = sqlite_commit.connect(self._path, self._statements,
                                                      busy_timeout_ms=0, checkpoints=False)

    # ------------------------------------------------------------------ the writer process
    async def _run_batch(self, batch):
        try:
            return await self._writer.commit(batch, self._plan_from_cache(batch))
        finally:
            if self._inline_conn is None and self._inline_budget > 0 and not self._closed:
                async with self._reopening:  # (several writer tasks: one reopens)
                    try:  # the inline connection broke earlier: reopen it off the loop
                        await asyncio.get_running_loop().run_in_executor(None,
                                                                         self._open_inline)
                    except sqlite3.Error:
                        log.warning("cannot reopen the inline SQLite connection",
                                    exc_info=True)

    def _attempt_abandoned(self) -> None:
        self._writer.abandon()

    async def _checkpoint(self) -> None:
        try:
            await self._writer.checkpoint()
        except Exception:  # noqa: BLE001 - the next one retries
            log.warning("WAL checkpoint failed; the next one retries", exc_info=True)
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
            plan = commit_batch(conn, self._statements, batch, cached)
        except Exception as exc:  # noqa: BLE001 - the writer retries and reports it
            self._forget_heads(batch)
            if _is_busy(exc):  # another process writes: leave the lock to the writer
                self._inline_paused_until = time.monotonic() + 0.05
            else:
                log.warning("inline commit failed (%s); handing over to the writer", exc)
                self._inline_conn = None  # reopened after the writer's next batch
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
            self._checkpoint_task = asyncio.ensure_future(self._checkpoint())
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
            log.info("inline commits over budget (last %.1f ms, budget %.1f ms): the writer "
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
        if self._checkpoint_task is not None:
            await asyncio.gather(self._checkpoint_task, return_exceptions=True)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._close_inline)
        finally:
            await self._writer.close()
