"""SQLite: an append planned from cached heads commits in one sqlite3 call (the INSERT into
the temporary view whose trigger checks and writes the heads), because every call returns
to Python and must win the GIL back from a busy event loop. Batches too big for one
statement take the transactional path, with the same head check."""

from __future__ import annotations

import asyncio

import pytest

from session_store.storage.sqlite import commit as sqlite_commit
from session_store.storage.sqlite import statements as sqlite_statements
from session_store.audit.verify import verify_log

from ..helpers import msg, sql


@pytest.fixture
async def sqlite_backend(migrated):
    return migrated


async def _trace(store) -> None:
    """Record every statement the writer process runs from now on."""
    await store._committer._writer.trace(True)


async def _traced(store) -> list[str]:
    """The statements the writer ran since `_trace` (or the last `_traced`)."""
    seen = await store._committer._writer.trace(False)
    await store._committer._writer.trace(True)
    return seen


async def test_a_cached_append_is_one_statement_and_its_own_transaction(sqlite_backend):
    store = await sqlite_backend.open()
    try:
        await store.append("s", [msg(0)], 0)  # a new stream: heads read under the lock
        await _trace(store)
        await asyncio.gather(store.append("s", [msg(1), msg(2)], 1),
                             store.append("t", [msg(0)], 0))
        # The new stream "t" alone in a batch, or with "s": either way not from the cache.
        await _traced(store)
        assert await store.append("s", [msg(3)], 3) == 4
        seen = await _traced(store)
        # (the trace repeats the statement for each statement its trigger runs)
        assert {q.split(" VALUES")[0] for q in seen} == {
            f"INSERT INTO temp.{sqlite_commit.APPEND_VIEW}"}, seen
        assert store.stats["stale_heads"] == 0
    finally:
        await store.close()
    reopened = await sqlite_backend.open()  # what another process reads
    try:
        assert [r.event.text for r in await reopened.read("s")] == [f"turn {i}" for i in range(4)]
        assert all(r.ok for r in await verify_log(reopened))
    finally:
        await reopened.close()


async def test_a_batch_too_big_for_one_statement_checks_its_heads_too(sqlite_backend,
                                                                    monkeypatch):
    monkeypatch.setattr(sqlite_statements, "_MAX_ROWS_PER_STATEMENT", 1)
    store = await sqlite_backend.open()
    try:
        await store.append("s", [msg(0)], 0)
        await _trace(store)
        assert await store.append("s", [msg(1), msg(2)], 1) == 3
        seen = await _traced(store)
        assert seen[0] == "BEGIN IMMEDIATE" and seen[-1] == "COMMIT"
        assert store.stats["cached_plans"] == 1
        # The head row changes behind the cache (an epoch raised by hand, or another store).
        await sql(sqlite_backend, "UPDATE session_streams SET epoch = 5")
        assert await store.append("s", [msg(3), msg(4)], 3, unfenced=True) == 5
        assert store.stats["stale_heads"] == 1 and store.stats["cached_plans"] == 1
        assert [r.event.text for r in await store.read("s")] == [f"turn {i}" for i in range(5)]
        assert (await store.list_streams())[0].epoch == 5
        assert all(r.ok for r in await verify_log(store))
    finally:
        await store.close()


async def test_one_statement_chains_requests_of_a_stream_and_raises_its_epoch(sqlite_backend):
    """A batch from the cache with two streams, three requests on one of them chaining onto
    each other, the second raising the epoch: each event's check expects the head the event
    before it left (its hash, and the batch's epoch once the head was written)."""
    store = await sqlite_backend.open()
    try:
        await store.append("s", [msg(0)], 0, epoch=1)
        await store.append("u", [msg(0)], 0)
        await _trace(store)
        got = await asyncio.gather(store.append("s", [msg(1), msg(2)], 1, epoch=1),
                                   store.append("s", [msg(3)], 3, epoch=2),
                                   store.append("u", [msg(1)], 1),
                                   store.append("s", [msg(4)], 4, epoch=2))
        assert got == [3, 4, 2, 5]
        seen = await _traced(store)
        assert store.stats["cached_plans"] == 1 and store.stats["stale_heads"] == 0
        assert {q.split(" VALUES")[0] for q in seen} == {
            f"INSERT INTO temp.{sqlite_commit.APPEND_VIEW}"}
        assert [(h.stream_id, h.version, h.epoch) for h in await store.list_streams()] == [
            ("s", 5, 2), ("u", 2, 0)]
        assert [r.event.text for r in await store.read("s")] == [f"turn {i}" for i in range(5)]
        assert all(r.ok for r in await verify_log(store))
    finally:
        await store.close()
