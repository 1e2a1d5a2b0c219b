"""A SQLite database file removed, replaced or truncated under a running store, or its WAL.

SQLite keeps writing to a file that was unlinked while open (and to its WAL): every commit
succeeds, into a file nobody will read again, gone when the process ends. Before 2026-12-02 the
store acknowledged such appends (three in a row, in the first test below): acknowledged and
lost. Then each commit checked, before it was acknowledged, that the path still names the
file it wrote to; but with the WAL removed ~9,600 more appends were acknowledged (~225 of
them gone after a kill -9, and verify said ok), and with the database file truncated to 0
~9,300 (then "database disk image is malformed"). Now each commit checks the database file
and the WAL it has open, before and after it, and the store refuses every append from then
on (StoreFilesChanged). Changes in place keep the inode (`: > db-wal`, `cp other.db db`):
each commit also checks the files' content against SQLite's WAL index (watch.py), and each
checkpoint of the writer a few pages it cannot write (the file written over while it ran
passed for its work: 8 of 350 runs of db-overwritten-never under load, 2026-12-06).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3

import pytest

from session_store import SchemaMismatch, StoreUnavailable, open_store
from session_store.errors import StoreFilesChanged
from session_store.events import BotStartedSpeaking
from session_store.storage.migrate import upgrade
from session_store.storage.sqlite.commit import FilesChanged, checkpoint, connect
from session_store.storage.sqlite.statements import compile_statements
from session_store.storage.sqlite.watch import Changed, FileWatch
from tests.service.helpers import migrated_sqlite


def _event(n: int = 1) -> BotStartedSpeaking:
    return BotStartedSpeaking(generation=n)


@pytest.mark.parametrize("inline", ["never", "always"])
async def test_appends_after_the_file_was_removed_are_never_acknowledged(tmp_path, inline):
    path = tmp_path / "log.db"
    async with migrated_sqlite(path, inline=inline) as store:
        v = await store.append("call", [_event()], 0)
        os.unlink(path)
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                await store.append("call", [_event()], v, timeout=0.5)
    assert not path.exists(), "the store created an empty database where the old one was"


async def test_reads_after_the_file_was_removed_never_create_an_empty_database(tmp_path):
    """Reads go through their own connections (a pool): a new one opened after the removal
    created a new, empty database at the path (SQLite's default open mode), answered
    "no such table" (a bare OperationalError, not an outage), and the appends after it
    failed the same way, at once, instead of as an outage until their deadline."""
    path = tmp_path / "log.db"
    async with migrated_sqlite(path) as store:
        v = await store.append("call", [_event()], 0)
        os.unlink(path)
        # Several at once: the pool opens new connections for them.
        results = await asyncio.gather(*(store.read("call") for _ in range(4)),
                                       store.stream_version("call"), store.read_all(),
                                       return_exceptions=True)
        assert not path.exists(), "a read created an empty database where the old one was"
        for result in results:
            if isinstance(result, BaseException):
                assert isinstance(result, StoreUnavailable), repr(result)
        with pytest.raises(StoreUnavailable):
            await store.append("call", [_event()], v, timeout=0.5)
    assert not path.exists()


async def test_a_store_opened_on_a_missing_file_says_what_to_run_and_creates_nothing(tmp_path):
    path = tmp_path / "log.db"
    with pytest.raises(SchemaMismatch, match="session-store migrate"):
        await open_store(f"sqlite+aiosqlite:///{path}")
    assert not path.exists(), "opening a store created an empty database"


def _replace(path: str) -> None:
    """A copy of the file renamed over it (what a restore or `sed -i` does)."""
    shutil.copyfile(path, f"{path}.copy")
    os.replace(f"{path}.copy", path)


def _overwrite(path: str) -> None:
    """Another database's bytes written over the file in place, not shorter than it (as
    `cp other.db db`, same inode; without its truncation first, which the store may catch
    as "truncated" instead)."""
    other = f"{path}.other"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x BLOB)")
    conn.execute("INSERT INTO t VALUES (zeroblob(?))", (os.path.getsize(path) + 8192,))
    conn.commit()
    conn.close()
    with open(other, "rb") as src, open(path, "r+b") as dst:
        dst.write(src.read())


CHANGES = {
    "wal-emptied": (lambda db: os.truncate(f"{db}-wal", 0), "write-ahead log",
                    "-wal was emptied or overwritten"),
    "db-overwritten": (_overwrite, "database file", "was overwritten"),
    "wal-removed": (lambda db: os.unlink(f"{db}-wal"), "write-ahead log", "-wal was removed"),
    "wal-replaced": (lambda db: _replace(f"{db}-wal"), "write-ahead log", "-wal was replaced"),
    # (Cut while a checkpoint runs, and written long again by it: "truncated or overwritten".)
    "db-truncated": (lambda db: os.truncate(db, 0), "database file", "was truncated"),
    "db-shrunk": (lambda db: os.truncate(db, 4096), "database file", "was truncated"),
    "db-replaced": (_replace, "database file", "was replaced"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("inline", ["never", "always"])
@pytest.mark.parametrize("change", list(CHANGES))
async def test_appends_after_the_files_changed_are_refused_for_good(tmp_path, inline, change):
    """Appending back to back (one append in flight at a time) while the file is changed:
    at most the one in flight is acknowledged after it (it may have committed just before),
    then every append fails at once with a clear error, and the store takes no more."""
    path = tmp_path / "log.db"
    do, what, said = CHANGES[change]
    async with migrated_sqlite(path, inline=inline) as store:
        acknowledged: list[int] = []

        async def append_on() -> None:
            v = 0
            while True:
                v = await store.append("call", [_event(v)], v)
                acknowledged.append(v)

        appending = asyncio.ensure_future(append_on())
        while len(acknowledged) < 50 and not appending.done():
            await asyncio.sleep(0.005)
        # (A checkpoint copies the WAL into the file: each change then has something to act on.)
        assert os.path.getsize(f"{path}-wal") > 0 and os.path.getsize(path) > 4096
        before = len(acknowledged)
        do(str(path))
        with pytest.raises(StoreFilesChanged) as caught:
            await asyncio.wait_for(appending, 10)
        assert len(acknowledged) - before <= 1, f"{len(acknowledged) - before} acknowledged"
        assert f"the {what} {path}" in str(caught.value) and said in str(caught.value)
        assert "takes no more appends" in str(caught.value)
        for stream in ("call", "another"):  # for good, on every path an append may take
            with pytest.raises(StoreFilesChanged):
                await store.append(stream, [_event()], 0, urgent=True)


async def _watched_checkpoint(tmp_path, during) -> None:
    """A commit that puts page 1 in the WAL (the database grows), then the writer's idle
    checkpoint with `during(path)` run as its PRAGMA starts: after the check before it."""
    path = str(tmp_path / "log.db")
    await upgrade(f"sqlite+aiosqlite:///{path}")
    conn = connect(path, compile_statements(), watch=FileWatch(path))
    try:
        conn.execute("CREATE TABLE pad (x BLOB)")
        conn.execute("INSERT INTO pad VALUES (zeroblob(20000))")
        conn.check_files()
        conn.set_trace_callback(lambda sql: during(path) if "wal_checkpoint" in sql else None)
        checkpoint(conn)
    finally:
        conn.close()


async def test_a_file_overwritten_while_the_checkpoint_runs_is_caught(tmp_path):
    """Seen under load (db-overwritten-never above, 8 of 350 runs): the bytes written over
    the file as the idle checkpoint ran. It copied the WAL's pages back over them, page 1 with
    our header, and truncated the file to our size: the checks after it saw the work of a
    checkpoint, and the pages not in the WAL stayed another database's."""
    with pytest.raises(FilesChanged, match="was overwritten .*its page \\d+ changed"):
        await _watched_checkpoint(tmp_path, _overwrite)


async def test_pages_another_process_commits_during_the_checkpoint_are_its_work(tmp_path):
    """A commit of another connection as the checkpoint starts: the checkpoint copies its
    pages too (page 2 here, in no frame before it, now with another value): no overwrite."""
    def commit_elsewhere(path: str) -> None:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("UPDATE alembic_version SET version_num = version_num || 'x'")
        other.close()

    await _watched_checkpoint(tmp_path, commit_elsewhere)


def _wal_table(path: str, rows: int, row_bytes: int) -> sqlite3.Connection:
    """A database in WAL mode that checkpoints only when asked, with `rows` random blobs."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (x BLOB)")
    for _ in range(rows):
        conn.execute("INSERT INTO t VALUES (randomblob(?))", (row_bytes,))
    return conn


def test_the_pages_of_a_long_wal_are_read_from_every_block_of_its_index(tmp_path):
    """The witness keeps to pages in no WAL frame, by the index's page numbers: past 4062
    frames they are in its second 32 KiB block. Each frame's header names its page too."""
    path = str(tmp_path / "long.db")
    conn = _wal_table(path, rows=50, row_bytes=400000)  # ~100 pages a commit
    watch = FileWatch(path)
    try:
        watch.check()
        assert watch.frames > 4062 + 100
        with open(f"{path}-wal", "rb") as wal:
            page_size = int.from_bytes(wal.read(32)[8:12], "big")
            by_header = []
            for frame in range(watch.frames):
                wal.seek(32 + frame * (24 + page_size))
                by_header.append(int.from_bytes(wal.read(4), "big"))
        for first, last in ((1, watch.frames), (4000, 4100), (4063, watch.frames)):
            assert watch._wal_pages(first, last) == set(by_header[first - 1:last])
    finally:
        watch.close()
        conn.close()


def test_a_file_truncated_while_a_checkpoint_runs_is_called_truncated(tmp_path):
    """Truncated while a checkpoint runs, the file is written long again by it (its pages
    from the WAL, holes of zeros between): neither its size nor its header says so; the
    witness pages, read as zeros, do, and the error says the file was truncated."""
    path = str(tmp_path / "cut.db")
    conn = _wal_table(path, rows=20, row_bytes=8000)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # (the file holds pages the WAL does not)
    conn.execute("INSERT INTO t VALUES (randomblob(8000))")
    watch = FileWatch(path)
    try:
        watch.check()
        witness = watch.witness()
        assert witness is not None and witness[3]
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header = f.read(4096)
        os.truncate(path, 0)  # ... as the checkpoint began, which then wrote its pages back:
        os.truncate(path, size)  # as long as before, holes between (header restored)
        with open(path, "r+b") as f:
            f.write(header)
        with pytest.raises(Changed, match=r"the database file .*cut\.db was truncated"):
            watch.check_witness(witness)
    finally:
        watch.close()
        conn.close()
