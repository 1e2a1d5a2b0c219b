"""Followers that scale: a follower of one call reads that call only (memory bounded by what
it shows, whatever the other calls write), and any number of followers of one store (`tail`,
the viewer's live pages) share one LISTEN connection and a bounded pool.

What many live clients cost the bots' appends is measured in bench/live_clients.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tracemalloc

import httpx
import pytest

from bench.pg_connections import pg_connections
from session_store import events as ev

from ..store.contract.test_tailing import following as collecting
from .conftest import running_viewer, viewer_client

MB = 1 << 20


def big(i: int, size: int = MB) -> ev.ConversationMessage:
    return ev.ConversationMessage("user", f"{i}:" + "x" * size, 1)


async def until(predicate, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.01)


@pytest.mark.timeout(120)
async def test_a_follower_of_a_quiet_call_never_reads_the_other_calls(store):
    """20 MB of another call committed after the quiet call's last event: following the
    quiet call from there reads none of it (before: the whole log from that point, 500 rows
    a page, filtered in Python)."""
    await store.append("quiet", [ev.ConversationMessage("user", "hello", 1)], 0)
    for i in range(20):
        await store.append("busy", [big(i)], i)
    tracemalloc.start()
    try:
        async with collecting(store, stream_id="quiet", after_version=1) as got:
            await asyncio.sleep(0.5)  # (it has read what there is and waits)
            await store.append("quiet", [ev.ConversationMessage("user", "still there?", 1)], 1)
            await until(lambda: len(got) == 1, 10, "the quiet call's new event")
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(r.stream_id, r.version) for r in got] == [("quiet", 2)]
    assert peak < 5 * MB, f"following a quiet call peaked at {peak / MB:.1f} MB"


@pytest.mark.timeout(60)
async def test_a_follower_from_a_position_starts_after_it_in_its_own_call(store):
    """`subscribe(from_position, stream_id=)` (no version): the call's events after that
    position in the global order, read from the call; a position no event has is refused."""
    await store.append("a", [ev.ConversationMessage("user", "a1", 1)], 0)
    await store.append("b", [ev.ConversationMessage("user", "b1", 1)], 0)
    await store.append("a", [ev.ConversationMessage("user", "a2", 1)], 1)
    b1 = (await store.read("b"))[0].position
    async with collecting(store, from_position=b1, stream_id="a") as got:
        await until(lambda: len(got) == 1, 10, "a2")
    assert [r.version for r in got] == [2]
    with pytest.raises(ValueError, match="no event at position"):
        await anext(store.subscribe(b1 + 1000, stream_id="a"))
    with pytest.raises(ValueError, match="give stream_id"):
        await anext(store.subscribe(after_version=3))


@pytest.mark.timeout(60)
async def test_closing_the_store_ends_its_followers(store):
    store.poll_interval = 30  # only the close can end them in time
    ends = []

    async def follow(**kwargs):
        async for _ in store.subscribe(**kwargs):
            pass
        ends.append(kwargs)

    tasks = [asyncio.create_task(follow(stream_id=f"c{i}", after_version=0)) for i in range(5)]
    tasks.append(asyncio.create_task(follow()))
    await asyncio.sleep(0.3)
    await store.close()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert len(ends) == 6


@pytest.mark.timeout(60)
@pytest.mark.parametrize("of_one_call", [False, True])
async def test_a_close_during_a_followers_read_ends_it(store, monkeypatch, of_one_call):
    """The close comes while a follower's read is under way (past its loop's check for a
    closed store; a slow LISTEN set-up under load made it so): the follower ends, as with
    a close between reads, instead of raising StoreClosed."""
    closed = asyncio.Event()
    name = "read" if of_one_call else "read_all"
    real = getattr(store, name)

    async def read_after_the_close(*args, **kwargs):
        await closed.wait()
        return await real(*args, **kwargs)

    monkeypatch.setattr(store, name, read_after_the_close)
    got = []

    async def follow():
        kwargs = {"stream_id": "c1", "after_version": 0} if of_one_call else {}
        async for e in store.subscribe(**kwargs):
            got.append(e)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.2)
    await store.close()
    closed.set()
    await asyncio.wait_for(task, 5)  # ended, not raised
    assert got == []


@pytest.mark.timeout(120)
async def test_two_hundred_followers_share_one_listen_connection(backend, migrated):
    """200 followers of 50 calls and 20 of the whole log, on PostgreSQL: the store holds
    its pool (at most 2 x pool_size) and one LISTEN connection, not one per follower, and
    each follower gets its call's next event."""
    if backend.name != "postgres":
        pytest.skip("SQLite has no connections to count")
    store = await migrated.open(pool_size=4)
    try:
        calls = [f"call-{i}" for i in range(50)]
        for call in calls:
            await store.append(call, [ev.ConversationMessage("user", "hi", 1)], 0)
        before = pg_connections()
        followers = [collecting(store, stream_id=calls[i % 50], after_version=1)
                     for i in range(200)]
        followers += [collecting(store) for _ in range(20)]
        async with contextlib.AsyncExitStack() as stack:
            lists = [await stack.enter_async_context(f) for f in followers]
            await until(lambda: all(len(got) == 50 for got in lists[200:]), 30,
                        "the log followers read the log")
            for call in calls:
                await store.append(call, [ev.ConversationMessage("user", "there?", 1)], 1)
            await until(lambda: all(len(got) == 1 for got in lists[:200]), 30,
                        "every call follower got its call's next event")
            held = pg_connections()
        assert held - before <= 2 * 4 + 1, f"{held - before} connections for 220 followers"
    finally:
        await store.close()


@pytest.mark.timeout(180)
async def test_sixty_live_viewer_clients_hold_a_bounded_number_of_connections(backend,
                                                                             migrated):
    """60 browsers on the live pages of 20 open calls: the viewer holds a bounded number of
    PostgreSQL connections (before: one LISTEN each), and each browser gets its call's next
    event."""
    if backend.name != "postgres":
        pytest.skip("SQLite has no connections to count")
    store = await migrated.open()
    try:
        calls = [f"live-{i}" for i in range(20)]
        for call in calls:
            await store.append(call, [ev.ConversationMessage("user", "hi", 1)], 0)
        before = pg_connections()
        with running_viewer(migrated) as base:
            limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
            async with viewer_client(base, timeout=30, limits=limits) as http:
                async def browse(call: str, opened: asyncio.Event, updates: list):
                    async with http.stream("GET", f"/api/live/{call}") as stream:
                        async for line in stream.aiter_lines():
                            if line.startswith("data:"):
                                updates.append(json.loads(line[5:]))
                                if len(updates) == 1:
                                    opened.set()
                                if len(updates) == 2:
                                    return

                opened = [asyncio.Event() for _ in range(60)]
                updates: list[list] = [[] for _ in range(60)]
                tasks = [asyncio.create_task(browse(calls[i % 20], opened[i], updates[i]))
                         for i in range(60)]
                try:
                    await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 60)
                    await asyncio.sleep(0.5)  # (each follows: its first read is done)
                    held = pg_connections()
                    for call in calls:
                        await store.append(call, [ev.ConversationMessage("user", "there?", 1)],
                                           1)
                    await asyncio.wait_for(asyncio.gather(*tasks), 60)
                finally:
                    for task in tasks:
                        task.cancel()
        assert all(u[1]["head"] == 2 for u in updates)
        # The viewer's pool (8, up to 16 with overflow) and its one listener.
        assert held - before <= 17, f"{held - before} connections for 60 live clients"
    finally:
        await store.close()
