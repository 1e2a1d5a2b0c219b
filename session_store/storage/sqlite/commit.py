"""One SQLite group commit on a plain sqlite3 connection, synchronous.

Shared by the writer process (writer.py, every commit by default) and the inline path
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
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from ..batch import (CLOSED_TYPE, BatchPlan, _AppendRequest, claims_wanted, plan_batch,
                    stored_hashes_wanted)
from .watch import Changed, FileWatch

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
    select_closed: str  # the first event of a type after a version: (stream_id, version, type)
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


class FilesChanged(Exception):
    """The files of an open database were removed, replaced or truncated under it. Not an
    outage: a new connection would open whatever the path names now (a database without the
    commits of the lost WAL, a truncated file, another database) and go on there. The store
    that hears it takes no more appends."""


class CommitConnection(sqlite3.Connection):
    """A connection that knows which files it has open.

    SQLite goes on committing into files that were removed or replaced while open (into
    the unlinked file or WAL, which nobody will read again, and which vanish when the
    process ends), and into a database file truncated under it (until it reads a page that
    is gone: "database disk image is malformed"). Every such commit was acknowledged and
    lost. So each commit checks, after it and before it is acknowledged (`check_files`: two
    stats), that the paths still name the database file and the WAL it has open, and that
    the database file did not shrink. No commit checkpoints (wal_autocheckpoint=0): the
    writer does, between commits (`checkpoint`), checked before and after. The log never
    shrinks its file: only a VACUUM would, which a live store's database must not get."""

    path: str
    wal_path: str
    size: int  # the largest the database file was seen: it only grows
    _db: tuple[int, int]  # (device, inode)
    _wal: tuple[int, int] | None  # None: no WAL (yet)

    watch: FileWatch | None = None  # their content, since the store opened (watch.py)

    def opened(self, path: str, watch: FileWatch | None) -> None:
        """Note the files just opened (after a read: SQLite opens the WAL with the first)."""
        self.path, self.wal_path, self.size, self._wal = path, path + "-wal", 0, None
        try:
            st = os.stat(path)
        except OSError:
            self._changed(f"the database file {path} was removed")
        self._db = (st.st_dev, st.st_ino)
        self.watch = watch
        self.check_files()

    def check_file(self) -> None:
        """The database file: still the one opened, and not shorter than it was."""
        try:
            st = os.stat(self.path)
        except OSError:  # (gone, or its directory cannot be read: not the file it had)
            self._changed(f"the database file {self.path} was removed")
        if st.st_ino != self._db[1] or st.st_dev != self._db[0]:
            self._changed(f"the database file {self.path} was replaced")
        if st.st_size < self.size:
            self._changed(f"the database file {self.path} was truncated (from {self.size} "
                          f"to {st.st_size} bytes)")
        self.size = st.st_size

    def check_files(self) -> None:
        """`check_file`, and the WAL: still the one this connection has open."""
        self.check_file()
        try:
            st = os.stat(self.wal_path)
        except OSError:
            if self._wal is not None:
                self._changed(f"the write-ahead log {self.wal_path} was removed")
            return
        if self._wal is None:
            self._wal = (st.st_dev, st.st_ino)  # (created since: the one it has open)
        elif st.st_ino != self._wal[1] or st.st_dev != self._wal[0]:
            self._changed(f"the write-ahead log {self.wal_path} was replaced")
        if self.watch is not None:  # the same files: their content (watch.py)
            try:
                self.watch.check()
            except Changed as exc:
                self._changed(str(exc))

    def check_witness(self, witness: tuple) -> None:
        """After a checkpoint: the pages it could not write are as `FileWatch.witness`
        read them before it."""
        try:
            if self.watch is not None:
                self.watch.check_witness(witness)
        except Changed as exc:
            self._changed(str(exc))

    def _changed(self, what: str):
        raise FilesChanged(
            f"{what} while this store had it open: commits since the last checkpoint may be "
            "lost with it, and nothing this store writes there now would be read again; it "
            "takes no more appends. Close it and check the database (`session-store verify`) "
            "before opening it again")


def connect(path: str, statements: Statements, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS,
            checkpoints: bool = True, watch: FileWatch | None = None) -> CommitConnection:
    """A connection that commits batches. isolation_level=None: we issue BEGIN IMMEDIATE
    ourselves, so the write lock is held from the head check to the commit. The file must
    exist (`mode=rw`): a removed database is never silently created again, empty. `watch`
    checks the files' content: its owner keeps it across connections, so that a connection
    opened after a change does not take the changed files for the ones it watched."""
    conn = sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=rw", uri=True,
                           isolation_level=None, check_same_thread=False,
                           factory=CommitConnection)
    try:
        if checkpoints:
            _switch_to_wal(conn, busy_timeout_ms)
        # SQLite's own checkpoint would run inside a commit, where no check sees it start
        # (`checkpoint`); the writer runs them instead, the backstop included (child.py).
        conn.execute("PRAGMA wal_autocheckpoint=0")
        configure(conn, busy_timeout_ms)
        conn.execute("PRAGMA temp_store=MEMORY")  # the view and trigger: no temporary file
        for ddl in statements.append_view:
            conn.execute(ddl)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # (opens the WAL)
        conn.opened(path, watch)
    except BaseException:
        conn.close()
        raise
    return conn


def _switch_to_wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """`PRAGMA journal_mode=WAL` (persistent in the file). Two processes opening a database
    still in rollback mode at once both hold a shared lock and want an exclusive one: SQLite
    answers one of them "database is locked" at once, without its busy handler (it would
    deadlock). Asked again, it finds the file in WAL mode, or gets the lock."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


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


def commit_batch(conn: CommitConnection, st: Statements, batch: list[_AppendRequest],
                 cached: BatchPlan | None,
                 on_planned: Callable[[list[_AppendRequest]], None] | None = None) -> BatchPlan:
    """Commit a batch: the cached plan if its heads still hold, else a plan from the heads
    read under the write lock. Sets each request's `final_hash` as it plans; `on_planned`
    hears of a plan made here before it is committed (the writer process tells its parent,
    which must know the hashes of a commit whose reply it may never get). FilesChanged if
    the database's files changed under the connection (after it commits: it must not be
    acknowledged)."""
    if cached is not None:
        if _commit_planned(conn, st, cached):
            conn.check_files()
            return cached
        for r in batch:  # another store moved a head: nothing was written
            r.final_hash = None
    with _immediate(conn):
        plan = plan_batch(batch, _read_heads(conn, st, batch), _read_hashes(conn, st, batch),
                          _read_closed(conn, st, batch))
        plan.stale = cached is not None
        if on_planned is not None:
            on_planned(batch)
        if not _write_plan(conn, st, plan):
            raise RuntimeError("a stream head row changed under SQLite's write lock")
        conn.execute("COMMIT")
    conn.check_files()
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
    heads: dict[str, object] = {}
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


def _read_closed(conn: sqlite3.Connection, st: Statements,
                 batch: list[_AppendRequest]) -> dict[tuple[str, int], int]:
    """Where a call a takeover claims was closed after what its caller read (`claims_wanted`)."""
    closed = {}
    for sid, after in claims_wanted(batch):
        version = conn.execute(st.select_closed, (sid, after, CLOSED_TYPE)).fetchone()[0]
        if version is not None:
            closed[(sid, after)] = version
    return closed


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


def checkpoint(conn: CommitConnection) -> None:
    # Pages the checkpoint will not write, read before the check that proves them ours: a
    # file written over while it runs would pass for its work otherwise (watch.py).
    witness = conn.watch.witness() if conn.watch is not None else None
    conn.check_files()  # (never copy the WAL into a file truncated or replaced under it)
    conn.execute("PRAGMA main.wal_checkpoint(PASSIVE)").fetchall()
    conn.check_files()  # (and what it wrote is what the next check compares with)
    if witness is not None:
        conn.check_witness(witness)
