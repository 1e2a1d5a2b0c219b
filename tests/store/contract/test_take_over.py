"""`take_over`: a takeover's append goes at whatever version the stream's head is, raising its
fencing epoch, so an old worker that keeps appending cannot starve it (issue #27, item 1).
What the old worker committed before it stays; every append of an older epoch after it is
Fenced, whichever path it takes (cached head, one statement, SQLite inline)."""

from __future__ import annotations

import asyncio

import pytest

from session_store import events as ev
from session_store.errors import CallClosed, ConcurrencyConflict, Fenced
from session_store.audit.verify import verify_log

from ..helpers import msg, opened, sql


def attached(worker: str, epoch: int) -> ev.WorkerAttached:
    return ev.WorkerAttached(worker, epoch, "takeover")


@pytest.mark.parametrize("inline", ["never", "always"])
async def test_a_takeover_goes_after_whatever_the_old_worker_committed(migrated, inline):
    if migrated.name == "postgres" and inline == "always":
        pytest.skip("inline commits are SQLite's")
    extra = {"inline": inline} if migrated.name == "sqlite" else {}
    old, new = await migrated.open(**extra), await migrated.open(**extra)
    try:
        v = await old.append("c", [opened()], 0, epoch=1)
        v = await old.append("c", [msg(1)], v, epoch=1)  # the new worker reads up to here
        read = v
        for i in range(2, 5):  # ... and the old worker goes on (its head cached)
            v = await old.append("c", [msg(i)], v, epoch=1)
        assert await new.take_over("c", [attached("w2", 2)], 2, after_version=read) == v + 1
        assert await new.stream_head("c") == (v + 1, (await new.read("c"))[-1].hash, 2)
        for expected in (v, v + 1):  # the old worker's next append, at any version: fenced
            with pytest.raises(Fenced):
                await old.append("c", [msg(9)], expected, epoch=1)
        assert await new.append("c", [msg(10)], v + 1, epoch=2) == v + 2
        assert [r.type for r in await new.read("c")][-3:] == [
            "conversation.message", "session.worker_attached", "conversation.message"]
        report, = await verify_log(new, "c")
        assert report.ok, report
    finally:
        await old.close()
        await new.close()


async def test_a_takeover_loses_only_to_another_takeover(store):
    await store.append("c", [opened()], 0, epoch=1)
    assert await store.take_over("c", [attached("w2", 2)], 2, after_version=1) == 2
    for epoch in (1, 2):  # read before w2 attached: the same epoch, or an older one
        with pytest.raises(Fenced):
            await store.take_over("c", [attached("w3", epoch)], epoch, after_version=1)
    assert await store.take_over("c", [attached("w3", 3)], 3, after_version=1) == 3
    assert [r.event.epoch for r in (await store.read("c"))[1:]] == [2, 3]


async def test_a_call_closed_after_what_the_taker_read_is_not_taken_over(store):
    v = await store.append("c", [opened(), msg(1)], 0, epoch=1)
    await store.append("c", [ev.SessionClosed("ended"), msg(2)], v, epoch=1)
    with pytest.raises(CallClosed, match="at or before version 3"):
        await store.take_over("c", [attached("w2", 2)], 2, after_version=v)
    assert await store.stream_head("c") == (4, (await store.read("c"))[-1].hash, 1)
    # Closed before what it read: the caller's own concern (the CallDriver refuses it).
    assert await store.take_over("c", [attached("w2", 2)], 2, after_version=4) == 5


async def test_a_call_closed_in_the_same_batch_is_not_taken_over(store):
    """The old worker's close and the takeover committed together (one group commit)."""
    v = await store.append("c", [opened()], 0, epoch=1)
    batches = store.stats["batches"]
    closing = store.append("c", [ev.SessionClosed("ended")], v, epoch=1)
    taking = store.take_over("c", [attached("w2", 2)], 2, after_version=v)
    got = await asyncio.gather(closing, taking, return_exceptions=True)
    assert got[0] == 2 and isinstance(got[1], CallClosed), got
    assert store.stats["batches"] == batches + 1
    assert await store.stream_version("c") == 2


async def test_a_takeover_of_events_that_are_gone_is_a_conflict(store):
    await store.append("c", [opened(), msg(1)], 0, epoch=1)
    with pytest.raises(ConcurrencyConflict) as caught:
        await store.take_over("c", [attached("w2", 2)], 2, after_version=5)
    assert (caught.value.expected, caught.value.actual) == (5, 2)
    with pytest.raises(ValueError, match="int epoch of 1 or more"):
        await store.take_over("c", [attached("w2", 0)], 0, after_version=2)
    with pytest.raises(ValueError, match="after_version"):
        await store.take_over("c", [attached("w2", 2)], 2, after_version=-1)
    assert await store.stream_version("c") == 2


async def test_after_a_takeover_an_append_without_an_epoch_is_fenced_unless_unfenced(store):
    """An old worker that passed no epoch went on appending after the takeover that fenced it
    (issue #34, item 5): after one, leaving the epoch out is refused, and appending unfenced
    is said (`unfenced=True`), not a default."""
    v = await store.append("c", [opened()], 0, epoch=1)
    v = await store.append("c", [msg(1)], v)  # (one worker so far: no epoch is fine)
    v = await store.take_over("c", [attached("w2", 2)], 2, after_version=v)
    for urgent in (False, True):  # (urgent: SQLite may commit it inline)
        with pytest.raises(Fenced, match="without an epoch is fenced off by epoch 2") as caught:
            await store.append("c", [msg(2)], v, urgent=urgent)
        assert (caught.value.epoch, caught.value.current_epoch) == (None, 2)
    assert await store.stream_version("c") == v
    assert await store.append("c", [msg(2)], v, unfenced=True) == v + 1
    assert await store.append("c", [msg(3)], v + 1, epoch=2) == v + 2
    with pytest.raises(Fenced):  # unfenced says nothing to an epoch passed with it
        await store.append("c", [msg(4)], v + 2, epoch=1, unfenced=True)
    report, = await verify_log(store, "c")
    assert report.ok, report


async def test_verify_reports_a_head_epoch_set_lower_than_the_log_records(store, migrated):
    """A head epoch lowered behind the log's back re-admits the worker a takeover fenced;
    verify said ok (issue #34, item 5)."""
    v = await store.append("c", [opened()], 0, epoch=1)
    v = await store.take_over("c", [attached("w2", 2)], 2, after_version=v)
    await sql(migrated, "UPDATE session_streams SET epoch = 1 WHERE stream_id = 'c'")
    report, = await verify_log(store, "c")
    assert not report.ok and report.first_bad_version == v, report
    assert "the head says fencing epoch 1 but the log records epoch 2" in report.reason
    assert "lets a fenced worker append again" in report.reason
    await sql(migrated, "UPDATE session_streams SET epoch = 0 WHERE stream_id = 'c'")
    report, = await verify_log(store, "c")
    assert not report.ok and "fencing epoch 0 but the log records epoch 2" in report.reason
    await sql(migrated, "UPDATE session_streams SET epoch = 2 WHERE stream_id = 'c'")
    report, = await verify_log(store, "c")
    assert report.ok, report
