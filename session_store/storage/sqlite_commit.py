"""One SQLite group commit on a plain sqlite3 connection, synchronous.

Shared by the writer process (`sqlite_writer`, every commit by default) and the inline path
(an idle store committing on the event loop's thread, opt-in): one way to commit, wherever it
runs. No SQLAlchemy here, so the writer process starts without it: the store compiles the
statements from the Core tables (`schema.py`) and hands them over as `Statements`.

A batch planned from cached heads (the usual case) is one INSERT into a temporary view whose
trigger checks and writes each head (see `Statements.append_trigger`): the whole transaction
is one sqlite3 call; otherwise BEGIN IMMEDIATE, the heads read under the lock, the writes,
COMMIT.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from .batch import BatchPlan, _AppendRequest, plan_batch, stored_hashes_wanted

BUSY_TIMEOUT_MS = 5000

# A batch planned from cached heads commits as one INSERT into this temporary view, whose
# INSTEAD OF trigger (Statements.append_view, see the store) checks each event against its
# stream's head row and writes both; a head that moved aborts the statement with HEAD_MOVED,
# and nothing is written.
APPEND_VIEW = "session_store_append"
APPEND_COLUMNS = ("stream_id", "version", "type", "schema_version", "data", "recorded_at_us",
                  "hash", "prev_hash", "expect_epoch", "epoch")
HEAD_MOVED = "session_store: stream head moved"


@dataclass(frozen=True)
class Statements:
    """The SQL of a commit, compiled by the store from its Core tables (qmark style)."""
    select_heads: str  # "... WHERE stream_id IN ({marks})"
    select_hash: str  # the hash of one event: (stream_id, version)
    insert_stream: str  # (s, v, h, e, t, t2)
    update_stream: str  # conditional on the old head: (v, h, e, t, s, ov, oh, oe)
    insert_event: str  # (s, v, ty, sv, d, t, h)
    append_view: tuple[str, ...]  # the temporary view and its trigger
    # Rows one INSERT into the view may carry (bound-parameter limit); more: transactional.
    max_rows_per_statement: int


def bound_parameter_limit() -> int:
    conn = sqlite3.connect(":memory:")
    try:
        return conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)  # 32766 since SQLite 3.32
    finally:
        conn.close()


@functools.lru_cache(maxsize=128)
def _append_sql(rows: int) -> str:
    marks = "(" + ",".join("?" * len(APPEND_COLUMNS)) + ")"
    return f"INSERT INTO temp.{APPEND_VIEW} VALUES " + ",".join([marks] * rows)


def configure(conn: sqlite3.Connection, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
    cur = conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")  # PRAGMA takes no parameters
    # FULL: a commit survives power loss, not only a process crash (NORMAL would not).
    cur.execute("PRAGMA synchronous=FULL")
    cur.close()


class CommitConnection(sqlite3.Connection):
    """A connection that knows which file it opened.

    A database file removed (or replaced) while open goes on taking commits: SQLite writes
    to the unlinked file and its WAL, which nobody will read again, and which vanish when
    the process ends. Every commit would be acknowledged and lost. So each commit checks,
    after it and before it is acknowledged, that the path still names the file it wrote
    (`check_same_file`; one stat, ~2 us)."""

    path: str
    file_id: tuple[int, int]

    def check_same_file(self) -> None:
        try:
            st = os.stat(self.path)
            now = (st.st_dev, st.st_ino)
        except OSError:
            now = None
        if now != self.file_id:
            exc = sqlite3.OperationalError(
                f"the database file {self.path} was {'removed' if now is None else 'replaced'} "
                "while this store had it open: the commit went to the old file, which nobody "
                "reads, and was not acknowledged")
            # An outage for the store: retried until the append's deadline, on a new
            # connection (to the new file, or none: it is never created again here).
            exc.sqlite_errorcode, exc.sqlite_errorname = sqlite3.SQLITE_IOERR, "SQLITE_IOERR"
            raise exc


def connect(path: str, statements: Statements, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS,
            checkpoints: bool = True) -> CommitConnection:
    """A connection that commits batches. isolation_level=None: we issue BEGIN IMMEDIATE
    ourselves, so the write lock is held from the head check to the commit. The file must
    exist (`mode=rw`): a removed database is never silently created again, empty."""
    conn = sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=rw", uri=True,
                           isolation_level=None, check_same_thread=False,
                           factory=CommitConnection)
    try:
        st = os.stat(path)
        conn.path, conn.file_id = path, (st.st_dev, st.st_ino)
        if checkpoints:
            conn.execute("PRAGMA journal_mode=WAL")  # persistent in the file
        else:
            conn.execute("PRAGMA wal_autocheckpoint=0")
        configure(conn, busy_timeout_ms)
        conn.execute("PRAGMA temp_store=MEMORY")  # the view and trigger: no temporary file
        for ddl in statements.append_view:
            conn.execute(ddl)
    except BaseException:
        conn.close()
        raise
    return conn


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


def commit_batch(conn: sqlite3.Connection, st: Statements, batch: list[_AppendRequest],
                 cached: BatchPlan | None,
                 on_planned: Callable[[list[_AppendRequest]], None] | None = None) -> BatchPlan:
    """Commit a batch: the cached plan if its heads still hold, else a plan from the heads
    read under the write lock. Sets each request's `final_hash` as it plans; `on_planned`
    hears of a plan made here before it is committed (the writer process tells its parent,
    which must know the hashes of a commit whose reply it may never get)."""
    if cached is not None:
        if _commit_planned(conn, st, cached):
            conn.check_same_file()
            return cached
        for r in batch:  # another store moved a head: nothing was written
            r.final_hash = None
    with _immediate(conn):
        plan = plan_batch(batch, _read_heads(conn, st, batch), _read_hashes(conn, st, batch))
        plan.stale = cached is not None
        if on_planned is not None:
            on_planned(batch)
        if not _write_plan(conn, st, plan):
            raise RuntimeError("a stream head row changed under SQLite's write lock")
        conn.execute("COMMIT")
    conn.check_same_file()
    return plan


def _commit_planned(conn: sqlite3.Connection, st: Statements, plan: BatchPlan) -> bool:
    """Commit a plan made from cached heads; False (nothing written) if a head moved.

    In one statement (the view's trigger) when it fits: no transaction of ours is open, so
    SQLite runs it as its own transaction, from taking the write lock to the fsync of the
    commit, inside one sqlite3 call."""
    if len(plan.events) > st.max_rows_per_statement:  # (a plan from the cache creates none)
        with _immediate(conn):  # a huge batch: the conditional writes
            moved = not _write_plan(conn, st, plan)
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
        if str(exc) != HEAD_MOVED:
            raise
        return False
    return True


def _read_heads(conn: sqlite3.Connection, st: Statements, batch: list[_AppendRequest]) -> dict:
    ids = sorted({r.stream_id for r in batch})
    heads = {}
    for chunk in range(0, len(ids), 500):  # SQLite's bound-parameter limit
        part = ids[chunk:chunk + 500]
        sql = st.select_heads.format(marks=",".join("?" * len(part)))
        heads.update((row[0], row[1:]) for row in conn.execute(sql, part))
    return heads


def _read_hashes(conn: sqlite3.Connection, st: Statements,
                 batch: list[_AppendRequest]) -> dict[tuple[str, int], str]:
    """The stored hashes a retried batch is checked against (`stored_hashes_wanted`)."""
    stored = {}
    for sid, version in stored_hashes_wanted(batch):
        row = conn.execute(st.select_hash, (sid, version)).fetchone()
        if row is not None:
            stored[(sid, version)] = row[0]
    return stored


def _write_plan(conn: sqlite3.Connection, st: Statements, plan: BatchPlan) -> bool:
    """Write a plan's rows; False (some rows may be written) if a head row moved."""
    if not plan.events:
        return True
    if plan.created:
        conn.executemany(st.insert_stream, [(s, v, h, e, t, t) for s, v, h, e, t in plan.created])
    if plan.updated:
        cur = conn.executemany(st.update_stream, [(v, h, e, t, s, ov, oh, oe)
                                                  for s, v, h, e, t, ov, oh, oe in plan.updated])
        if cur.rowcount != len(plan.updated):
            return False
    conn.executemany(st.insert_event, plan.events)
    return True


def checkpoint(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA main.wal_checkpoint(PASSIVE)").fetchall()
