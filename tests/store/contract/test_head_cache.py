"""The stream-head cache: a store plans appends from the heads it last committed, and stays
correct when another store (as another process would) moves a stream behind its back.

Each test shows the path it means to test was taken (stats: `cached_plans`, `stale_heads`),
so it cannot pass by going around the cache.
"""

from __future__ import annotations

import asyncio

import pytest

from session_store import events as ev
from session_store.errors import ConcurrencyConflict, Fenced
from session_store.audit.verify import verify_log

from ..helpers import msg, opened, sql


async def _texts(store, sid):
    return [r.event.text for r in await store.read(sid)]


async def test_appends_after_the_first_are_planned_from_the_cache(store):
    assert await store.append("s", [msg(0)], 0) == 1  # new stream: heads read from the db
    cached = store.stats["cached_plans"]
    for v in range(1, 6):
        assert await store.append("s", [msg(v)], v) == v + 1
    assert store.stats["cached_plans"] - cached == 5
    assert store.stats["stale_heads"] == 0
    report, = await verify_log(store, "s")
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
        assert all(r.ok for r in await verify_log(b))
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
    assert all(r.ok for r in await verify_log(store))


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
        assert all(r.ok for r in await verify_log(b))
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
        assert all(r.ok for r in await verify_log(b))
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
        assert all(r.ok for r in await verify_log(b))
    finally:
        await a.close()
        await b.close()

async def test_cache_is_bounded_and_evicted_streams_are_read_again(store):
    store._heads.max_heads = 3
    for i in range(6):
        await store.append(f"s{i}", [msg(0)], 0)
    assert len(store._heads) == 3 and set(store._heads) == {"s3", "s4", "s5"}
    cached = store.stats["cached_plans"]
    assert await store.append("s0", [msg(1)], 1) == 2  # evicted: heads read from the database
    assert store.stats["cached_plans"] == cached
    assert await store.append("s0", [msg(2)], 2) == 3
    assert store.stats["cached_plans"] == cached + 1
