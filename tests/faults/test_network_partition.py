"""PostgreSQL behind a dead network: nothing closes, nothing answers.

A crashed or restarting server closes its sockets (test_db_outage.py); a partitioned one
is silent, and TCP would let a statement wait for minutes. The store must bound every
attempt, fail each append at its own deadline, retry the others when the network comes
back, and count a commit whose answer was lost exactly once. The proxy (netproxy.py) sits
between the store and the shared PostgreSQL; each test has its own schema.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from session_store import StoreUnavailable, open_store
from session_store.events import BotStartedSpeaking
from session_store.migrate import upgrade

from ..conftest import PG_DSN, PG_URL
from .netproxy import PartitionProxy

# An append or read that outlives this is hanging where it should have given up.
HANG_S = 15.0


def _event(n: int = 1) -> BotStartedSpeaking:
    return BotStartedSpeaking(generation=n)


@pytest.fixture
async def behind_proxy():
    """(open a store through the proxy, the proxy, the schema's name)."""
    schema = f"p_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(PG_DSN)
    await conn.execute(f"CREATE SCHEMA {schema}")
    await upgrade(PG_URL, schema=schema)
    upstream = make_url(PG_URL)
    proxy = await PartitionProxy(upstream.host, upstream.port or 5432).start()
    url = upstream.set(port=proxy.port).render_as_string(hide_password=False)
    opened = []

    async def open_(**options):
        store = await open_store(url, schema=schema, **options)
        opened.append(store)
        return store

    try:
        yield open_, proxy, schema
    finally:
        proxy.heal()
        for store in opened:
            await asyncio.wait_for(store.close(), HANG_S)
        await proxy.close()
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


async def _rows(schema: str, stream: str) -> list[int]:
    """The stream's versions as the database holds them (straight to it, past the proxy)."""
    conn = await asyncpg.connect(PG_DSN)
    try:
        return [r[0] for r in await conn.fetch(
            f"SELECT version FROM {schema}.session_events WHERE stream_id = $1 ORDER BY version",
            stream)]
    finally:
        await conn.close()


async def test_append_in_a_partition_fails_at_its_own_deadline(behind_proxy):
    open_, proxy, schema = behind_proxy
    store = await open_()
    v = await store.append("call", [_event()], 0)
    v = await store.append("call", [_event()], v)
    proxy.partition()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="no answer"):
        await asyncio.wait_for(store.append("call", [_event()], v, timeout=1.0), HANG_S)
    took = time.monotonic() - started
    # Its deadline (1 s), not TCP's; the attempt is never cut before min_attempt_s (0.5).
    assert 0.9 <= took < 3.0, took
    proxy.heal()
    # Nothing got through either way: the stream is as it was, and the next append at the
    # same version goes in (the store forgot the head it could not confirm).
    assert await _rows(schema, "call") == [1, 2]
    assert await asyncio.wait_for(store.append("call", [_event()], v), HANG_S) == 3
    assert [r.ok for r in await store.verify("call")] == [True]


async def test_commit_whose_answer_the_partition_ate_counts_once(behind_proxy):
    open_, proxy, schema = behind_proxy
    store = await open_(attempt_timeout=1.0)
    v = 0
    for _ in range(3):  # (the statement is prepared: the commit goes out in one message)
        v = await store.append("call", [_event()], v)
    proxy.partition(replies_only=True)  # the server hears us; we never hear it
    append = asyncio.ensure_future(store.append("call", [_event(2)], v, timeout=30))
    deadline = time.monotonic() + 5
    while await _rows(schema, "call") != [1, 2, 3, 4]:
        assert time.monotonic() < deadline, "the commit never reached the server"
        await asyncio.sleep(0.05)
    await asyncio.sleep(2.5)  # attempts are cut after 1 s and retried: still no answer
    assert not append.done()
    proxy.heal()
    # The retry finds its own commit (by its hashes) instead of a conflict, and writes
    # nothing twice.
    assert await asyncio.wait_for(append, HANG_S) == 4
    assert await _rows(schema, "call") == [1, 2, 3, 4]
    assert [e.data_json for e in await store.read("call", 4)] == [
        '{"generation":2,"source":"model"}']
    assert [r.ok for r in await store.verify("call")] == [True]


@pytest.mark.parametrize("replies_only", [False, True], ids=["both-ways", "replies-lost"])
async def test_sixteen_calls_wait_out_a_partition(behind_proxy, replies_only):
    """Batches of the writer tasks, in flight when the network goes: every append is
    acknowledged once it comes back, and each acknowledged event is in the log exactly once."""
    open_, proxy, schema = behind_proxy
    store = await open_(attempt_timeout=1.0)
    acked: dict[str, list[int]] = {f"call-{i}": [] for i in range(16)}
    stop = asyncio.Event()

    async def call(stream: str) -> None:
        v = 0
        while not stop.is_set():
            v = await store.append(stream, [_event(v + 1)], v, timeout=30)
            acked[stream].append(v)
            await asyncio.sleep(0.005)

    calls = [asyncio.ensure_future(call(s)) for s in acked]
    await asyncio.sleep(0.5)
    proxy.partition(replies_only=replies_only)
    await asyncio.sleep(2.5)
    during = {s: len(v) for s, v in acked.items()}
    proxy.heal()
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*calls), HANG_S)
    assert all(during[s] < len(v) for s, v in acked.items()), "some call never resumed"
    for stream, versions in acked.items():
        assert versions == list(range(1, len(versions) + 1))
        assert await _rows(schema, stream) == versions, stream
    assert store.stats["retries"] > 0


async def test_read_in_a_partition_raises_store_unavailable(behind_proxy):
    open_, proxy, _schema = behind_proxy
    store = await open_(read_timeout=1.0, attempt_timeout=1.0)
    await store.append("call", [_event()], 0)
    proxy.partition()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="no answer in time"):
        await asyncio.wait_for(store.read("call"), HANG_S)
    # The pool's ping of its idle connection, then a new connection: each bounded.
    assert time.monotonic() - started < 4.0
    proxy.heal()
    assert [e.version for e in await asyncio.wait_for(store.read("call"), HANG_S)] == [1]
