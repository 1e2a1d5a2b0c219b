"""SQLite inline commits: an append that finds the store idle commits on the event loop's
thread (no hand-off to the writer process), and must never hold the loop for long."""

from __future__ import annotations

import asyncio
import os
import sqlite3

import pytest

from session_store.storage.sqlite import commit as sqlite_commit
from session_store.storage.sqlite import inline as sqlite_inline
from session_store.audit.verify import verify_log

from ..helpers import msg


@pytest.fixture
async def sqlite_backend(migrated):
    return migrated


# Tests that count inline commits switch the budget guard off (a huge budget): this machine's
# disk may be slow at any moment, and then the guard rightly sends appends to the thread.
NO_GUARD = {"inline": "always", "inline_budget": 60.0}


async def test_idle_appends_commit_inline_and_are_durable(sqlite_backend):
    store = await sqlite_backend.open(**NO_GUARD)
    try:
        v = 0
        for i in range(20):
            v = await store.append("s", [msg(i)], v)
        assert v == 20 and store.stats["inline"] == 20 and store.stats["batches"] == 20
    finally:
        await store.close()
    reopened = await sqlite_backend.open()  # what a new process sees
    try:
        assert [r.event.text for r in await reopened.read("s")] == [f"turn {i}" for i in range(20)]
        assert all(r.ok for r in await verify_log(reopened))
    finally:
        await reopened.close()


async def test_an_inline_commit_lets_ready_tasks_run_first(sqlite_backend):
    """The commit holds the loop for an fsync, so whatever is ready runs first (in a live
    call, the audio already pushed): every inline append gives the loop one turn before it
    commits, and a caller appending in a tight loop never starves the other tasks."""
    store = await sqlite_backend.open(**NO_GUARD)
    try:
        v = await store.append("s", [msg(0)], 0)
        ran: list[str] = []

        async def ready_task():
            ran.append("other")

        asyncio.ensure_future(ready_task())  # ready, not yet run
        store_commit = store._committer._inline.commit

        def commit_and_log(request, cached):
            ran.append("commit")
            return store_commit(request, cached)

        store._committer._inline.commit = commit_and_log
        v = await store.append("s", [msg(1)], v)
        assert ran == ["other", "commit"], ran
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.ensure_future(ticker())
        for i in range(2, 42):  # a tight loop: the ticker keeps getting turns
            v = await store.append("s", [msg(i)], v)
        assert v == 42 and store.stats["inline"] == 42
        assert ticks >= 40, "the appends starved the other task"
        other.cancel()
    finally:
        await store.close()


async def test_a_store_serving_several_streams_keeps_commits_off_the_loop(sqlite_backend):
    store = await sqlite_backend.open(**NO_GUARD)
    try:
        assert await store.append("a", [msg(0)], 0) == 1
        assert store.stats["inline"] == 1  # one call so far
        versions = {"a": 1, "b": 0}
        for i in range(6):  # two calls take turns
            sid = "ba"[i % 2]
            versions[sid] = await store.append(sid, [msg(i)], versions[sid])
        assert versions == {"a": 4, "b": 3}
        assert store.stats["inline"] == 1 and store.stats["batches"] == 7
        store._committer._inline.shared_until = 0.0  # a second later, only "a" is left
        assert await store.append("a", [msg(9)], 4) == 5
        assert store.stats["inline"] == 2
    finally:
        await store.close()


async def test_inline_budget_zero_sends_everything_to_the_writer(sqlite_backend):
    store = await sqlite_backend.open(inline="always", inline_budget=0)
    try:
        v = 0
        for i in range(5):
            v = await store.append("s", [msg(i)], v, urgent=True)
        assert v == 5 and store.stats["inline"] == 0 and store.stats["batches"] == 5
    finally:
        await store.close()


@pytest.mark.timeout(60)
async def test_write_lock_held_by_another_process_never_blocks_the_loop(sqlite_backend):
    """The inline connection does not wait for SQLite's lock: the append goes to the writer
    thread (which waits, up to busy_timeout) and the loop runs on meanwhile."""
    store = await sqlite_backend.open(**NO_GUARD)
    path = sqlite_backend.url.split("///", 1)[1]
    other = sqlite3.connect(path, isolation_level=None)
    loop = asyncio.get_running_loop()
    try:
        assert await store.append("s", [msg(0)], 0) == 1
        inline = store.stats["inline"]
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        started = loop.time()
        pending = asyncio.create_task(store.append("s", [msg(1)], 1))
        for _ in range(5):
            await asyncio.sleep(0.01)
        # Had the append waited for the lock on the loop's thread, this coroutine could not
        # have run before busy_timeout (5 s) was over.
        assert loop.time() - started < sqlite_commit.BUSY_TIMEOUT_MS / 1000
        assert not pending.done()
        other.execute("COMMIT")
        assert await asyncio.wait_for(pending, 10) == 2
        assert store.stats["inline"] == inline  # it went through the writer process
        assert await store.append("s", [msg(2)], 2) == 3
        assert store.stats["inline"] == inline + 1  # and the next idle append inline again
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
        await store.close()


async def test_a_broken_inline_connection_hands_over_and_is_reopened(sqlite_backend):
    store = await sqlite_backend.open(**NO_GUARD)
    try:
        assert await store.append("s", [msg(0)], 0) == 1
        store._committer._inline.conn.close()  # e.g. the handle went bad under us
        inline = store.stats["inline"]
        assert await store.append("s", [msg(1)], 1) == 2  # the writer process took it
        assert store.stats["inline"] == inline
        assert store._committer._inline.conn is not None  # reopened after the writer's batch
        assert await store.append("s", [msg(2)], 2) == 3
        assert store.stats["inline"] == inline + 1
        assert [r.version for r in await store.read("s")] == [1, 2, 3]
    finally:
        await store.close()


async def test_repeatedly_slow_commits_pause_inline_commits(sqlite_backend):
    """The budget guard (fed measured durations directly: a slow disk cannot be ordered)."""
    store = await sqlite_backend.open(inline="always", inline_budget=0.002)
    try:
        for _ in range(50):
            store._committer._inline.judge(0.0002)
        store._committer._inline.judge(0.003)  # one slow fsync on a busy machine: noise
        assert store._committer._inline.ready("s", True)
        store._committer._inline.judge(0.003)  # two close together: the disk is slow now
        assert not store._committer._inline.ready("s", True)
        batches, inline = store.stats["batches"], store.stats["inline"]
        assert await store.append("s", [msg(0)], 0) == 1  # paused: the writer process commits
        assert store.stats["batches"] == batches + 1 and store.stats["inline"] == inline

        store._committer._inline.paused_until = 0.0  # the pause is over
        assert store._committer._inline.ready("s", True)
        assert store._committer._inline.pause == 2 * sqlite_inline.PAUSE_MIN_S  # next pause is longer
        store._committer._inline.judge(0.025)  # one commit ten times over budget pauses at once
        assert not store._committer._inline.ready("s", True)
    finally:
        await store.close()


@pytest.mark.timeout(120)
async def test_wal_is_checkpointed_off_the_loop_and_stays_bounded(sqlite_backend):
    """Inline commits never checkpoint; the writer process does, and inline commits wait for
    it. Without it, 1,500 back-to-back appends grow the WAL to ~25 MB (measured)."""
    store = await sqlite_backend.open(**NO_GUARD)
    path = sqlite_backend.url.split("///", 1)[1]
    try:
        v = 0
        for i in range(1500):
            v = await store.append("s", [msg(i)], v)
        assert store.stats["inline"] > 1000
        wal = os.path.getsize(path + "-wal")
        assert wal < 12_000_000, f"WAL grew to {wal / 1e6:.1f} MB"
    finally:
        await store.close()


@pytest.mark.parametrize("mode, inline_plain, inline_urgent", [
    ("urgent", 0, 1), ("always", 1, 1), ("never", 0, 0)])
async def test_inline_mode_decides_which_appends_may_commit_inline(sqlite_backend, mode,
                                                                   inline_plain, inline_urgent):
    """Mode "urgent" commits only `urgent` appends (a tool's start, a result about to be
    sent) on the loop's thread; the rest go to the writer process, off the audio path."""
    store = await sqlite_backend.open(inline=mode, inline_budget=60.0)
    try:
        v = await store.append("s", [msg(0)], 0)
        assert store.stats["inline"] == inline_plain
        v = await store.append("s", [msg(1)], v, urgent=True)
        assert v == 2 and store.stats["inline"] == inline_plain + inline_urgent
        assert store.stats["batches"] == 2
    finally:
        await store.close()


async def test_an_unknown_inline_mode_is_refused(sqlite_backend):
    with pytest.raises(ValueError, match="inline must be"):
        await sqlite_backend.open(inline="sometimes")


async def test_checkpoints_beside_inline_commits_succeed(sqlite_backend, caplog):
    """The writer process checkpoints the main database only: a checkpoint of every attached
    database also visited the connection's temporary one (the one-statement commit's view)
    and failed now and then with "database table is locked"."""
    store = await sqlite_backend.open(**NO_GUARD)
    try:
        v = 0
        with caplog.at_level("WARNING", logger=sqlite_inline.__name__):
            for i in range(12 * sqlite_inline.CHECKPOINT_EVERY):
                v = await store.append("s", [msg(i)], v)
            while store._committer._inline.checkpointing:
                await asyncio.sleep(0.01)
        assert store.stats["inline"] > 10 * sqlite_inline.CHECKPOINT_EVERY
        assert not [r for r in caplog.records if "checkpoint" in r.getMessage()]
    finally:
        await store.close()


async def test_by_default_every_append_goes_to_the_writer(sqlite_backend):
    store = await sqlite_backend.open()  # inline left at its default
    try:
        v = await store.append("s", [msg(0)], 0)
        v = await store.append("s", [msg(1)], v, urgent=True)
        assert v == 2 and store.stats["inline"] == 0 and not store.commits_urgent_inline
    finally:
        await store.close()
