"""Following the log: subscribe() yields what is stored, then what commits, on every backend.

PostgreSQL's own side of following (NOTIFY from other processes, tailing readers that never
skip an event committed later with a lower position) is in tests/store/postgres/test_pg_tailing.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from ..helpers import msg

pytestmark = pytest.mark.tails


@contextlib.asynccontextmanager
async def following(store, from_position=0, **kwargs):
    """Run store.subscribe() in a task; yields the list it fills."""
    got: list = []

    async def run():
        async for rec in store.subscribe(from_position, **kwargs):
            got.append(rec)

    task = asyncio.create_task(run())
    try:
        yield got
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_for_count(got: list, n: int, timeout: float) -> float:
    """Wait until `got` holds n items; returns the time it took."""
    start = time.perf_counter()
    while len(got) < n:
        if time.perf_counter() - start > timeout:
            raise AssertionError(f"got {len(got)} of {n} events within {timeout}s: {got}")
        await asyncio.sleep(0.005)
    return time.perf_counter() - start


# --------------------------------------------------------------------------- subscribe

@pytest.mark.timeout(30)
async def test_subscribe_yields_existing_then_new_events(store):
    for i in range(3):
        await store.append("s", [msg(i)], i)
    # Polling so slow it cannot explain a fast delivery: only the in-process wake-up can.
    store.poll_interval = 10
    async with following(store) as got:
        await wait_for_count(got, 3, timeout=5)
        assert [r.event.text for r in got] == ["turn 0", "turn 1", "turn 2"]
        for i in range(3, 6):
            await store.append("s", [msg(i)], i)
            took = await wait_for_count(got, i + 1, timeout=2)
            assert took < 1.0
        await store.append("other", [msg(99)], 0)
        await wait_for_count(got, 7, timeout=2)
    assert [(r.stream_id, r.version) for r in got] == [("s", v) for v in range(1, 7)] + [
        ("other", 1)]
    assert [r.position for r in got] == sorted(r.position for r in got)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stream_id", [None, "s"])
async def test_a_follower_cancelled_as_a_change_wakes_it_stops(store, stream_id):
    """Cancelled in the moment a commit wakes it, a follower stops. It waited for a change
    with asyncio.wait_for, which on Python 3.11 returns the inner result when the cancel and
    the wake-up meet (the cancel is lost): it followed on, and whoever awaited its end hung
    (the flake of the test above: the last append's NOTIFY came as the test cancelled)."""
    await store.append("s", [msg(0)], 0)
    store.poll_interval = 10  # (a lost cancel then shows as a hang, not a slow stop)
    got: list = []

    async def run():
        async for rec in store.subscribe(stream_id=stream_id):
            got.append(rec)

    task = asyncio.create_task(run())
    await wait_for_count(got, 1, timeout=5)
    await asyncio.sleep(0.1)  # (waiting for a change)
    store._signal_change()  # the wake-up and the cancel in one turn of the loop
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=3)
    assert done, "the cancelled follower went on following"
    assert task.cancelled()


@pytest.mark.timeout(30)
async def test_subscribe_from_position_and_stream_filter(store):
    await store.append("a", [msg(0), msg(1)], 0)
    await store.append("b", [msg(2)], 0)
    start = (await store.read("a"))[0].position
    store.poll_interval = 10
    async with following(store, start, stream_id="a") as got:
        await wait_for_count(got, 1, timeout=5)
        await store.append("b", [msg(3)], 1)
        await store.append("a", [msg(4)], 2)
        await wait_for_count(got, 2, timeout=2)
        await asyncio.sleep(0.05)
    assert [(r.stream_id, r.version) for r in got] == [("a", 2), ("a", 3)]


@pytest.mark.timeout(30)
async def test_a_stream_filter_moves_past_full_batches_of_other_streams(store):
    """A follower of one stream reads the whole log: it moves past the other streams' events
    too. (Advancing only on its own stream's events, it read the same full batch of others
    again and again, and never got to "b".)"""
    await store.append("a", [msg(i) for i in range(5)], 0)
    await store.append("b", [msg(5)], 0)
    async with following(store, stream_id="b", batch_size=2) as got:
        await wait_for_count(got, 1, timeout=10)
        await store.append("a", [msg(6), msg(7)], 5)
        await store.append("b", [msg(8)], 1)
        await wait_for_count(got, 2, timeout=10)
    assert [(r.stream_id, r.version) for r in got] == [("b", 1), ("b", 2)]


# --------------------------------------------------------------------------- PostgreSQL race
