"""SQLite's writer process: the store commits through a child process of its own, which may
die like any process. Nothing acknowledged is lost, nothing is written twice, the store goes
on with a new one, and the child never outlives the store's process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from session_store.errors import ConcurrencyConflict, StoreUnavailable
from session_store.storage.sqlite.writer import WriterProcess
from session_store.audit.verify import verify_log

from ..contract.test_take_over import attached
from ..helpers import msg, opened


@pytest.fixture
async def sqlite_backend(migrated):
    return migrated


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


async def _texts(store, stream: str) -> list[str]:
    return [r.event.text for r in await store.read(stream)]


async def test_a_killed_writer_is_replaced_and_the_append_retried(sqlite_backend):
    store = await sqlite_backend.open()
    try:
        assert await store.append("s", [msg(0)], 0) == 1
        first = store._committer._writer._child.proc.pid
        os.kill(first, signal.SIGKILL)
        await store._committer._writer._child.proc.wait()
        # The append finds it dead (or sees it die): an outage, retried on a new process.
        assert await store.append("s", [msg(1)], 1) == 2
        assert store._committer._writer._child.proc.pid != first
        assert await store.append("s", [msg(2)], 2) == 3
        assert await _texts(store, "s") == ["turn 0", "turn 1", "turn 2"]
        assert all(r.ok for r in await verify_log(store))
    finally:
        await store.close()
    assert not _alive(first)


async def test_an_urgent_append_whose_writer_dies_under_it_is_retried_by_the_writer_task(
        sqlite_backend):
    """An urgent append to an idle store commits from its caller (`_append_direct`), one try:
    the writer dying under it (here while it waits for a lock another process holds) hands
    the append to the writer task, which starts a new writer and commits it, once."""
    path = sqlite_backend.url.split("///", 1)[1]
    store = await sqlite_backend.open()
    lock = sqlite3.connect(path, isolation_level=None)
    try:
        assert await store.append("s", [msg(0)], 0, urgent=True) == 1
        direct, batches = store.stats["direct"], store.stats["batches"]
        lock.execute("BEGIN IMMEDIATE")  # the writer waits for it (busy_timeout: 5 s)
        appending = asyncio.ensure_future(store.append("s", [msg(1)], 1, urgent=True))
        await asyncio.sleep(0.3)
        assert store._commits._direct == 1 and not appending.done()
        first = store._committer._writer._child.proc.pid
        os.kill(first, signal.SIGKILL)
        await store._committer._writer._child.proc.wait()
        lock.execute("ROLLBACK")
        assert await appending == 2
        assert store.stats["direct"] == direct, "the failed direct try was counted"
        assert store.stats["batches"] == batches + 1, "the writer task did not commit it"
        assert store._committer._writer._child.proc.pid != first
        assert await store.append("s", [msg(2)], 2, urgent=True) == 3
        assert store.stats["direct"] == direct + 1
        assert await _texts(store, "s") == ["turn 0", "turn 1", "turn 2"]
        assert all(r.ok for r in await verify_log(store))
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        await store.close()


@pytest.mark.parametrize("b_expected", [1, 2], ids=["competing", "chained"])
async def test_appends_issued_after_a_failed_direct_commit_go_after_it(sqlite_backend,
                                                                        b_expected):
    """A commits from its caller (the store was idle); B, to the same stream, comes while
    A waits for a lock and queues; the writer dies under A, which is handed back to the
    queue. A was issued first: it commits first. Before 2026-12-02 the writer task, already
    holding B, took A in behind it: competing, B won and A got a conflict; chained (B
    expects A's version), B got one."""
    path = sqlite_backend.url.split("///", 1)[1]
    store = await sqlite_backend.open()
    lock = sqlite3.connect(path, isolation_level=None)
    try:
        await store.append("s", [msg(0)], 0)
        lock.execute("BEGIN IMMEDIATE")
        a = asyncio.ensure_future(store.append("s", [msg(1)], 1))
        await asyncio.sleep(0.1)
        assert store._commits._direct == 1
        b = asyncio.ensure_future(store.append("s", [msg(2)], b_expected))
        await asyncio.sleep(0.2)
        os.kill(store._committer._writer._child.proc.pid, signal.SIGKILL)  # neither committed (the lock)
        lock.execute("ROLLBACK")
        outcomes = await asyncio.gather(a, b, return_exceptions=True)
        assert outcomes[0] == 2, outcomes
        if b_expected == 1:
            assert isinstance(outcomes[1], ConcurrencyConflict), outcomes
            assert await _texts(store, "s") == ["turn 0", "turn 1"]
        else:
            assert outcomes[1] == 3, outcomes
            assert await _texts(store, "s") == ["turn 0", "turn 1", "turn 2"]
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        await store.close()


async def test_an_append_whose_caller_gave_up_is_never_committed_later(sqlite_backend):
    """Its caller cancels it (a timeout of its own) while it waits in the queue behind a
    commit that waits for a lock; the caller reads the stream, sees nothing, and may decide
    again. Before 2026-12-02 the append stayed queued and committed once the lock was free:
    written after its caller had been told nothing."""
    path = sqlite_backend.url.split("///", 1)[1]
    store = await sqlite_backend.open()
    lock = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        await store.append("a", [msg(0)], 0)
        await store.append("b", [msg(0)], 0)
        lock.execute("BEGIN IMMEDIATE")
        slow = asyncio.ensure_future(store.append("a", [msg(1)], 1))  # direct, on the lock
        await asyncio.sleep(0.05)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(store.append("b", [msg(1)], 1), 0.3)
        assert await store.stream_version("b") == 1
        lock.execute("COMMIT")
        assert await slow == 2
        assert await store.append("a", [msg(2)], 2) == 3  # (the writer has moved on)
        assert await store.stream_version("b") == 1, "the abandoned append was committed"
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        await store.close()


@pytest.mark.parametrize("urgent", [True, False], ids=["direct", "writer-task"])
async def test_a_writer_that_stops_answering_fails_appends_at_their_deadline(sqlite_backend,
                                                                             urgent):
    """The child stops (SIGSTOP: as a disk that stopped answering holds it in an fsync).
    Before 2026-12-02 an append with a 1 s deadline waited for ever. Now the attempt is cut at
    the deadline, the child killed (it must not commit later), the append fails with
    StoreUnavailable, and the next one goes to a new child."""
    store = await sqlite_backend.open()
    try:
        v = await store.append("s", [msg(0)], 0)
        if not urgent:  # (two at once: they queue for the writer task)
            v = (await asyncio.gather(store.append("s", [msg(1)], 1),
                                      store.append("t", [msg(1)], 0)))[0]
        stopped = store._committer._writer._child.proc
        os.kill(stopped.pid, signal.SIGSTOP)
        started = time.monotonic()
        appends = [store.append("s", [msg(9)], v, timeout=1.0)]
        if not urgent:
            appends.append(store.append("t", [msg(9)], 1, timeout=1.0))
        outcomes = await asyncio.wait_for(asyncio.gather(*appends, return_exceptions=True), 10)
        assert all(isinstance(o, StoreUnavailable) for o in outcomes), outcomes
        assert time.monotonic() - started < 3.0
        await asyncio.wait_for(stopped.wait(), 5)  # killed (SIGKILL ends a stopped process)
        assert await store.append("s", [msg(2)], v) == v + 1
        assert store._committer._writer._child.proc.pid != stopped.pid
        assert await store.stream_version("s") == v + 1  # nothing written twice, nothing late
        assert all(r.ok for r in await verify_log(store))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(store._committer._writer._child.proc.pid, signal.SIGCONT)
        await store.close()


async def test_a_commit_whose_answer_was_lost_is_recognised_not_repeated(sqlite_backend,
                                                                         tmp_path, monkeypatch):
    """The child commits a batch it planned itself (a new stream: heads read under the lock)
    and dies before answering. The retry must see that very commit in the log and report
    success: not write it again, and not call it a conflict (the caller would then decide
    again and log its facts twice). The hashes sent before the commit make that possible."""
    monkeypatch.setenv("SESSION_STORE_TEST_DIE_ONCE", str(tmp_path / "died"))
    monkeypatch.setattr(WriterProcess, "child_module", "tests.store.sqlite.dying_sqlite_writer")
    store = await sqlite_backend.open()
    try:
        assert await store.append("s", [msg(0), msg(1)], 0) == 2  # planned in the child
        assert (tmp_path / "died").exists()  # the first writer did die after its commit
        # The first try (from the caller, `_append_direct`) died with its writer; the writer
        # task's try recognised the commit.
        assert store.stats["direct"] == 0 and store.stats["batches"] == 1
        assert await _texts(store, "s") == ["turn 0", "turn 1"]  # once
        assert await store.append("s", [msg(2)], 2) == 3
        with pytest.raises(ConcurrencyConflict):
            await store.append("s", [msg(9)], 2)  # a real conflict is still one
        assert all(r.ok for r in await verify_log(store))
    finally:
        await store.close()


async def test_a_lost_answer_is_recognised_after_another_writer_appended_behind_it(
        sqlite_backend, tmp_path, monkeypatch):
    """As above, but another process appends to the stream between the commit and the
    retry (it read the stream and saw the commit). The head then no longer holds the
    request's hash, and the retry called the request's own commit a conflict: the caller
    would decide again and log its facts twice. The stored event proves it."""
    monkeypatch.setenv("SESSION_STORE_TEST_DIE_ONCE", str(tmp_path / "died"))
    monkeypatch.setenv("SESSION_STORE_TEST_THEN_ANOTHER_APPENDS", "1")
    monkeypatch.setattr(WriterProcess, "child_module", "tests.store.sqlite.dying_sqlite_writer")
    store = await sqlite_backend.open()
    try:
        assert await store.append("s", [msg(0), msg(1)], 0) == 2  # ours, not a conflict
        assert (tmp_path / "died").exists()
        assert await _texts(store, "s") == ["turn 0", "turn 1", "another writer"]
        with pytest.raises(ConcurrencyConflict):
            await store.append("s", [msg(9)], 2)  # a real conflict is still one
        assert await store.append("s", [msg(2)], 3) == 4
        assert all(r.ok for r in await verify_log(store))
    finally:
        await store.close()


async def test_what_the_writer_prints_never_reaches_the_protocol(sqlite_backend, monkeypatch,
                                                                capfd):
    monkeypatch.setattr(WriterProcess, "child_module", "tests.store.sqlite.noisy_sqlite_writer")
    store = await sqlite_backend.open()
    try:
        v = 0
        for i in range(3):
            v = await store.append("s", [msg(i)], v)
        assert v == 3 and store.stats["retries"] == 0
        assert await _texts(store, "s") == ["turn 0", "turn 1", "turn 2"]
    finally:
        await store.close()
    assert "not a frame" in capfd.readouterr().out  # it did print


_WORKER = """
import asyncio, sys
from session_store import open_store
from session_store.events import ConversationMessage

async def main():
    store = await open_store(sys.argv[1])
    await store.append("s", [ConversationMessage("user", "before")], 0)
    print(store._committer._writer._child.proc.pid, flush=True)
    sys.stdin.readline()  # the test holds the write lock now
    print("appending", flush=True)
    await store.append("s", [ConversationMessage("user", "after its end")], 1)
    print("appended", flush=True)

asyncio.run(main())
"""


@pytest.mark.timeout(60)
async def test_the_writer_dies_with_the_process_that_owns_the_store(sqlite_backend):
    """A worker SIGKILLed while its writer waits to commit (another process holds SQLite's
    lock) must not leave the writer behind to commit after the worker's end: a new worker
    would have taken the call over by then. The writer dies with it (as a thread would)."""
    path = sqlite_backend.url.split("///", 1)[1]
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, sqlite_backend.url],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lock = sqlite3.connect(path, isolation_level=None)
    try:
        child = int(worker.stdout.readline())
        lock.execute("BEGIN IMMEDIATE")  # the writer will wait for it (busy_timeout: 5 s)
        worker.stdin.write("go\n")
        worker.stdin.flush()
        assert worker.stdout.readline().strip() == "appending"
        await asyncio.sleep(0.3)  # the request is in the writer, waiting for the lock
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        deadline = time.monotonic() + 3  # less than busy_timeout: still holding the lock
        while _alive(child) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not _alive(child)
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        if worker.poll() is None:
            worker.kill()
    store = await sqlite_backend.open()
    try:
        assert await _texts(store, "s") == ["before"]  # nothing written after its end
    finally:
        await store.close()


async def test_closing_the_store_ends_its_writer(sqlite_backend):
    store = await sqlite_backend.open()
    await store.append("s", [msg(0)], 0)
    pid = store._committer._writer._child.proc.pid
    await store.close()
    assert not _alive(pid)


async def test_a_takeover_whose_answer_was_lost_is_recognised(migrated, tmp_path, monkeypatch):
    """The SQLite writer commits the takeover and dies before answering; another process
    appends behind it before the retry. Retried, the takeover sees its own epoch on the head:
    without the version it was planned at (sent before the commit), it was called Fenced."""
    first = await migrated.open()
    try:
        await first.append("c", [opened(), msg(1)], 0, epoch=1)
    finally:
        await first.close()
    monkeypatch.setenv("SESSION_STORE_TEST_DIE_ONCE", str(tmp_path / "died"))
    monkeypatch.setenv("SESSION_STORE_TEST_THEN_ANOTHER_APPENDS", "1")
    monkeypatch.setattr(WriterProcess, "child_module", "tests.store.sqlite.dying_sqlite_writer")
    store = await migrated.open()
    try:
        assert await store.take_over("c", [attached("w2", 2)], 2, after_version=1) == 3
        assert (tmp_path / "died").exists()
        texts = [getattr(r.event, "text", r.type) for r in await store.read("c")]
        assert texts == ["session.opened", "turn 1", "session.worker_attached",
                         "another writer"]
        assert all(r.ok for r in await verify_log(store))
    finally:
        await store.close()
