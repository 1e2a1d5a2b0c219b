"""The stream-head cache: a store plans appends from the heads it last committed, and stays
correct when another store (as another process would) moves a stream behind its back.

Each test shows the path it means to test was taken (stats: `cached_plans`, `stale_heads`),
so it cannot pass by going around the cache.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from session_store import events as ev
from session_store.errors import ConcurrencyConflict, Fenced, StoreUnavailable

from ..conftest import PG_DSN
from .helpers import msg, opened, sql


async def _texts(store, sid):
    return [r.event.text for r in await store.read(sid)]


async def test_appends_after_the_first_are_planned_from_the_cache(store):
    assert await store.append("s", [msg(0)], 0) == 1  # new stream: heads read from the db
    cached = store.stats["cached_plans"]
    for v in range(1, 6):
        assert await store.append("s", [msg(v)], v) == v + 1
    assert store.stats["cached_plans"] - cached == 5
    assert store.stats["stale_heads"] == 0
    report, = await store.verify("s")
    assert report.ok and report.events_checked == 6


async def test_stream_moved_by_another_store_is_caught_when_written(migrated):
    a, b = await migrated.open(), await migrated.open()
    try:
        await a.append("s", [msg(1)], 0)
        await a.append("s", [msg(2)], 1)  # a has s at version 2 cached
        assert await b.append("s", [msg(3)], 2) == 3
        with pytest.raises(ConcurrencyConflict) as err:
            await a.append("s", [msg(4)], 2)  # agrees with a's cache, not with the database
        assert (err.value.expected, err.value.actual) == (2, 3)
        assert a.stats["stale_heads"] == 1
        assert await a.append("s", [msg(4)], 3) == 4  # a now knows version 3
        cached = a.stats["cached_plans"]
        assert await a.append("s", [msg(5)], 4) == 5
        assert a.stats["cached_plans"] == cached + 1  # and trusts its cache again
        assert await _texts(b, "s") == ["turn 1", "turn 2", "turn 3", "turn 4", "turn 5"]
        assert all(r.ok for r in await b.verify())
    finally:
        await a.close()
        await b.close()


async def test_takeover_by_another_store_fences_the_cached_old_writer(migrated):
    old, new = await migrated.open(), await migrated.open()
    try:
        await old.append("call", [opened(epoch=1)], 0, epoch=1)
        await old.append("call", [msg(1)], 1, epoch=1)  # old caches version 2, epoch 1
        assert await new.append("call", [ev.WorkerAttached("w2", 2)], 2, epoch=2) == 3
        with pytest.raises(Fenced) as err:
            await old.append("call", [msg(2)], 2, epoch=1)  # what old's cache expects
        assert (err.value.epoch, err.value.current_epoch) == (1, 2)
        assert old.stats["stale_heads"] == 1
        with pytest.raises(Fenced):
            await old.append("call", [msg(2)], 3, epoch=1)  # even at the right version
        assert await new.append("call", [msg(3)], 3, epoch=2) == 4
        heads = {h.stream_id: h for h in await new.list_streams()}
        assert (heads["call"].version, heads["call"].epoch) == (4, 2)
    finally:
        await old.close()
        await new.close()


async def test_head_row_changed_in_place_is_not_trusted(store, migrated):
    """The cached head must match the row in version, hash and epoch: an epoch raised with no
    new event (by hand, or by future code) still fences."""
    await store.append("s", [msg(0)], 0, epoch=1)
    await sql(migrated, "UPDATE session_streams SET epoch = 5 WHERE stream_id = 's'")
    with pytest.raises(Fenced) as err:
        await store.append("s", [msg(1)], 1, epoch=1)
    assert err.value.current_epoch == 5 and store.stats["stale_heads"] == 1
    assert await store.stream_version("s") == 1
    assert (await store.list_streams())[0].epoch == 5
    assert [r.version for r in await store.read("s")] == [1]  # no event without its head
    assert all(r.ok for r in await store.verify())


async def test_head_with_the_cached_version_but_another_hash_is_not_trusted(migrated):
    """A stream rewritten behind the store's back to the same version (a restore, then
    another worker's append): the cached hash no longer chains, so the append is planned
    again from the row and chains onto the event really stored."""
    a, b = await migrated.open(), await migrated.open()
    try:
        await a.append("s", [msg(1)], 0)
        await sql(migrated, "DELETE FROM session_events WHERE stream_id = 's'")
        await sql(migrated, "DELETE FROM session_streams WHERE stream_id = 's'")
        await b.append("s", [msg(9)], 0)
        assert await a.append("s", [msg(2)], 1) == 2
        assert a.stats["stale_heads"] == 1
        assert await _texts(b, "s") == ["turn 9", "turn 2"]
        assert all(r.ok for r in await b.verify())
    finally:
        await a.close()
        await b.close()


async def test_one_moved_stream_in_a_batch_fails_only_its_own_request(migrated):
    a, b = await migrated.open(), await migrated.open()
    try:
        for sid in ("x", "y", "z"):
            await a.append(sid, [msg(0)], 0)
        await b.append("y", [msg(1)], 1)
        results = await asyncio.gather(a.append("x", [msg(2)], 1), a.append("y", [msg(2)], 1),
                                       a.append("z", [msg(2)], 1), return_exceptions=True)
        assert results[0] == 2 and results[2] == 2, results
        assert type(results[1]) is ConcurrencyConflict and results[1].actual == 2
        assert a.stats["stale_heads"] == 1
        # Nothing of the first, partly written attempt survived.
        assert await _texts(b, "x") == ["turn 0", "turn 2"]
        assert await _texts(b, "y") == ["turn 0", "turn 1"]
        assert await _texts(b, "z") == ["turn 0", "turn 2"]
        assert [(h.stream_id, h.version) for h in await b.list_streams()] == [
            ("x", 2), ("y", 2), ("z", 2)]
        assert all(r.ok for r in await b.verify())
    finally:
        await a.close()
        await b.close()


async def test_heads_changed_behind_a_batch_of_several_streams_are_not_trusted(migrated):
    """As the two tests above, in batches of several streams (on PostgreSQL the cached path
    for several heads is its own statement): z rewritten to its cached version with another
    hash is chained onto what is really stored, and y's epoch raised in place still fences,
    while x commits each time. Nothing is written on the cached heads' word alone."""
    a, b = await migrated.open(), await migrated.open()

    async def batch(version: int, *sids: str):
        return await asyncio.gather(*(a.append(sid, [msg(version)], version, epoch=1)
                                      for sid in sids), return_exceptions=True)

    try:
        for sid in ("x", "y", "z"):
            await a.append(sid, [msg(0)], 0, epoch=1)
        await sql(migrated, "DELETE FROM session_events WHERE stream_id = 'z'")
        await sql(migrated, "DELETE FROM session_streams WHERE stream_id = 'z'")
        await b.append("z", [msg(9)], 0, epoch=1)  # version 1 again, another hash
        assert await batch(1, "x", "z") == [2, 2]
        assert a.stats["stale_heads"] == 1
        assert await _texts(b, "z") == ["turn 9", "turn 1"]

        await a.append("y", [msg(1)], 1, epoch=1)
        await sql(migrated, "UPDATE session_streams SET epoch = 5 WHERE stream_id = 'y'")
        results = await batch(2, "x", "y")
        assert results[0] == 3 and type(results[1]) is Fenced, results
        assert results[1].current_epoch == 5 and a.stats["stale_heads"] == 2
        assert await _texts(b, "y") == ["turn 0", "turn 1"]
        assert {h.stream_id: (h.version, h.epoch) for h in await b.list_streams()} == {
            "x": (3, 1), "y": (2, 5), "z": (2, 1)}
        assert all(r.ok for r in await b.verify())
    finally:
        await a.close()
        await b.close()

async def test_cache_is_bounded_and_evicted_streams_are_read_again(store):
    store.max_cached_heads = 3
    for i in range(6):
        await store.append(f"s{i}", [msg(0)], 0)
    assert len(store._heads) == 3 and set(store._heads) == {"s3", "s4", "s5"}
    cached = store.stats["cached_plans"]
    assert await store.append("s0", [msg(1)], 1) == 2  # evicted: heads read from the database
    assert store.stats["cached_plans"] == cached
    assert await store.append("s0", [msg(2)], 2) == 3
    assert store.stats["cached_plans"] == cached + 1


@pytest.mark.timeout(60)
async def test_writer_connections_killed_by_the_server_are_replaced(migrated):
    """PostgreSQL: the one-round-trip path needs a function in each writer connection's
    temporary schema; a replacement connection gets its own."""
    if migrated.name != "postgres":
        pytest.skip("PostgreSQL writer connections")
    store = await migrated.open()
    raw = await asyncpg.connect(PG_DSN)
    try:
        await store.append("s", [msg(0)], 0)
        await store.append("s", [msg(1)], 1)
        pids = [c.get_server_pid() for c in store._free]
        assert pids
        for pid in pids:
            assert await raw.fetchval("SELECT pg_terminate_backend($1)", pid)
        # Whether the client saw the end before the next statement (then it skips the dead
        # connection) or only on it (then the batch is retried on a new one) is a race.
        assert await store.append("s", [msg(2)], 2) == 3
        cached = store.stats["cached_plans"]
        assert await store.append("s", [msg(3)], 3) == 4
        assert store.stats["cached_plans"] > cached  # one round trip again, new connection
        assert not {c.get_server_pid() for c in store._free} & set(pids)
        assert await _texts(store, "s") == [f"turn {i}" for i in range(4)]
    finally:
        await raw.close()
        await store.close()


@pytest.mark.timeout(60)
async def test_a_head_row_locked_past_lock_timeout_is_waited_out_not_raised(migrated):
    """PostgreSQL writers give up on a row lock after `lock_timeout` (so a frozen writer
    cannot stall every batch behind it). Giving up raised asyncpg's LockNotAvailableError
    to the caller at once (no StoreUnavailable, no retry within the append's deadline); it
    is the database not taking the append for now, as an outage is."""
    if migrated.name != "postgres":
        pytest.skip("PostgreSQL row locks")
    store = await migrated.open(attempt_timeout=None)
    store._writer_kwargs["server_settings"]["lock_timeout"] = "300ms"  # (15 s by default)
    await store.append("s", [msg(0)], 0)
    schema = migrated.options["schema"]
    raw = await asyncpg.connect(PG_DSN)
    try:
        locked = raw.transaction()
        await locked.start()
        await raw.execute(f"SELECT 1 FROM {schema}.session_streams WHERE stream_id = 's' "
                          "FOR UPDATE")
        append = asyncio.ensure_future(store.append("s", [msg(1)], 1, timeout=20))
        await asyncio.sleep(1.5)  # several lock timeouts
        assert not append.done(), append.exception() if append.done() else None
        await locked.rollback()
        assert await asyncio.wait_for(append, 10) == 2
        with_deadline = await locked_append_fails_at_its_deadline(store, raw, schema)
        assert isinstance(with_deadline, StoreUnavailable), repr(with_deadline)
        assert await _texts(store, "s") == ["turn 0", "turn 1"]
    finally:
        await raw.close()
        await store.close()


async def locked_append_fails_at_its_deadline(store, raw, schema):
    async with raw.transaction():
        await raw.execute(f"SELECT 1 FROM {schema}.session_streams WHERE stream_id = 's' "
                          "FOR UPDATE")
        try:
            await store.append("s", [msg(2)], 2, timeout=1.0)
        except Exception as exc:  # noqa: BLE001 - returned to the test
            return exc
    return None


@pytest.mark.timeout(60)
async def test_a_read_only_server_is_an_outage_waited_out_not_raised(migrated):
    """A standby during a failover (or a database set read-only for maintenance) answers
    every write with "cannot execute ... in a read-only transaction". That is the database
    not taking appends for now (SQLite's SQLITE_READONLY is one already): it failed the
    append at once with asyncpg's ReadOnlySQLTransactionError. Here the writer connections
    are read-only sessions until the "failover" ends."""
    if migrated.name != "postgres":
        pytest.skip("PostgreSQL read-only sessions")
    store = await migrated.open()
    await store.append("s", [msg(0)], 0)
    for conn in store._free:  # connections from now on: read-only, as on a standby
        conn.terminate()
    settings = store._writer_kwargs["server_settings"]
    settings["default_transaction_read_only"] = "on"
    try:
        append = asyncio.ensure_future(store.append("s", [msg(1)], 1, timeout=20))
        await asyncio.sleep(1.0)
        assert not append.done(), append.exception() if append.done() else None
        del settings["default_transaction_read_only"]  # promoted: writes go through again
        assert await asyncio.wait_for(append, 10) == 2
        assert await _texts(store, "s") == ["turn 0", "turn 1"]
    finally:
        await store.close()
