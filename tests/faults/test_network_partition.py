"""PostgreSQL behind a dead network: nothing closes, nothing answers.

A crashed or restarting server closes its sockets (test_db_outage.py); a partitioned one
is silent, and TCP would let a statement wait for minutes. The store must bound every
attempt, fail each append at its own deadline, retry the others when the network comes
back, and count a commit whose answer was lost exactly once. The proxy (netproxy.py) sits
between the store and the shared PostgreSQL; each test has its own schema. The last tests run
a live call through a partition: what the receive loop logs (goAway, toolCallCancellation;
the toolCall is in test_db_outage.py's voice test) must not hold the bot's audio for it.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from service.local_live import (Audio, Call, CancelToolCalls, GoAway, Script, ToolCall,
                                TurnComplete, WaitSignal)
from session_store import Policy, StoreUnavailable, open_store
from session_store.events import BotStartedSpeaking
from session_store.storage.migrate import upgrade
from session_store.audit.verify import verify_log
from tests.service.helpers import (Ctl, Flavour, assert_cancelled_after_start, assert_chain_ok,
                                   assert_log_settled, assert_server_clean, handles_of,
                                   run_call)

from ..conftest import PG_DSN, PG_URL
from .netproxy import PartitionProxy
from .test_db_outage import _is_audio, _max_gap

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
    assert [r.ok for r in await verify_log(store, "call")] == [True]


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
    assert [r.ok for r in await verify_log(store, "call")] == [True]


async def test_a_lost_answer_is_recognised_after_another_writer_appended_behind_it(
        behind_proxy):
    """The commit lands, its answer is lost, and another store (not behind the partition)
    reads the stream and appends after it before the retry. The head no longer holds the
    request's hash: the retry called the request's own commit a conflict (the caller would
    decide again and log its facts twice). The stored event proves it."""
    open_, proxy, schema = behind_proxy
    store = await open_(attempt_timeout=1.0)
    v = 0
    for _ in range(3):
        v = await store.append("call", [_event()], v)
    proxy.partition(replies_only=True)
    append = asyncio.ensure_future(store.append("call", [_event(2)], v, timeout=30))
    deadline = time.monotonic() + 5
    while await _rows(schema, "call") != [1, 2, 3, 4]:
        assert time.monotonic() < deadline, "the commit never reached the server"
        await asyncio.sleep(0.05)
    other = await open_store(PG_URL, schema=schema)
    try:
        assert await other.append("call", [_event(3)], 4) == 5
    finally:
        await other.close()
    proxy.heal()
    assert await asyncio.wait_for(append, HANG_S) == 4  # ours, not a conflict
    assert await _rows(schema, "call") == [1, 2, 3, 4, 5]
    assert [r.ok for r in await verify_log(store, "call")] == [True]


async def test_two_appends_to_one_stream_whose_answer_was_lost_both_count_once(behind_proxy):
    """Committed together in one batch (chained), their answer lost: the retry finds the
    head at the second one's hash; the first is proved by the chain, not called a conflict."""
    open_, proxy, schema = behind_proxy
    store = await open_(attempt_timeout=1.0)
    v = 0
    for _ in range(3):
        v = await store.append("call", [_event()], v)
    proxy.partition(replies_only=True)
    both = asyncio.gather(store.append("call", [_event(11)], 3, timeout=30),
                          store.append("call", [_event(12)], 4, timeout=30))
    deadline = time.monotonic() + 5
    while await _rows(schema, "call") != [1, 2, 3, 4, 5]:
        assert time.monotonic() < deadline, "the batch never reached the server"
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)
    proxy.heal()
    assert await asyncio.wait_for(both, HANG_S) == [4, 5]
    assert await _rows(schema, "call") == [1, 2, 3, 4, 5]


async def test_attempt_cut_inside_a_transaction_is_bounded(behind_proxy):
    """The transaction path (a head not cached: here another store wrote the stream) with
    its row lock held elsewhere, so the statement is in flight when the network goes. The
    cut attempt used to wait for its ROLLBACK's answer, i.e. for the partition's end."""
    open_, proxy, schema = behind_proxy
    other = await open_store(PG_URL, schema=schema)
    try:
        await other.append("call", [_event()], 0)
    finally:
        await other.close()
    store = await open_(attempt_timeout=1.0)
    await store.append("warm", [_event()], 0)  # (a writer connection is open)
    locker = await asyncpg.connect(PG_DSN)
    try:
        async with locker.transaction():
            await locker.execute(f"SELECT 1 FROM {schema}.session_streams "
                                 "WHERE stream_id = 'call' FOR UPDATE")
            started = time.monotonic()
            append = asyncio.ensure_future(store.append("call", [_event()], 1, timeout=2.0))
            await asyncio.sleep(0.3)  # its SELECT ... FOR UPDATE waits for our lock
            proxy.partition()
            done, _ = await asyncio.wait({append}, timeout=HANG_S)
            took = time.monotonic() - started
        assert done, "the append hung past its deadline, waiting for the network"
        assert took < 4.0, took
        with pytest.raises(StoreUnavailable):
            append.result()
    finally:
        await locker.close()


async def test_close_in_a_partition_does_not_hang(behind_proxy):
    open_, proxy, _schema = behind_proxy
    store = await open_(attempt_timeout=1.0, read_timeout=1.0)
    await store.append("call", [_event()], 0)
    await store.read("call")  # (a pooled connection for reads too)
    proxy.partition()
    started = time.monotonic()
    await asyncio.wait_for(store.close(), HANG_S)  # (asyncpg waited for the server's goodbye)
    assert time.monotonic() - started < 5.0


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


async def test_a_head_read_in_a_partition_raises_store_unavailable(behind_proxy):
    """`stream_head` (a takeover's check of the tail) is a read like the others: a database
    that does not answer is StoreUnavailable, not the driver's own exception (it skipped
    the store's outage handling and raised a bare TimeoutError: not an outage to callers)."""
    open_, proxy, _schema = behind_proxy
    store = await open_(read_timeout=1.0, attempt_timeout=1.0)
    await store.append("call", [_event()], 0)
    proxy.partition()
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(store.stream_head("call"), HANG_S)
    proxy.heal()
    assert (await asyncio.wait_for(store.stream_head("call"), HANG_S))[0] == 1


async def test_a_follower_whose_listen_meets_a_partition_is_told_of_the_outage(
        behind_proxy, monkeypatch):
    """The network goes silent right after the follower's LISTEN connection is made, before
    its LISTEN is answered. The connect was bounded, the LISTEN was not: the follower hung
    in it for as long as the partition lasted (here: until the test's guard), neither
    reading nor raising. It must give up on listening and hear of the outage from its read
    (StoreUnavailable, as every read in a partition)."""
    open_, proxy, _schema = behind_proxy
    store = await open_(read_timeout=1.0, attempt_timeout=1.0)
    await store.append("call", [_event()], 0)
    listen = asyncpg.Connection.add_listener

    async def partition_then_listen(self, *args, **kwargs):
        proxy.partition()
        return await listen(self, *args, **kwargs)

    monkeypatch.setattr(asyncpg.Connection, "add_listener", partition_then_listen)
    follow = store.subscribe(0)
    try:
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(follow.__anext__(), HANG_S)
    finally:
        proxy.heal()
        await follow.aclose()


# --------------------------------------------------------------------------- a live call

ORDER = "lookup_order"
PARTITION_S = 3.0


async def _call_through_a_partition(open_, proxy, scripts, *, ready, **options) -> tuple:
    """A real pipeline (the service, google-genai, the local server) whose log is behind the
    proxy. Once `ready(ctl)` holds, the network goes silent for PARTITION_S and the server
    hears `db_down` (the script sends what it must say during the partition). Returns the
    run and (down, up) in wall-clock time."""
    store = await open_(attempt_timeout=1.0, read_timeout=1.0)
    marks: dict[str, float] = {}

    def log_idle(ctl: Ctl) -> bool:  # (nothing is being logged: the next fact goes at once)
        return not ctl.llm.driver.busy and not ctl.llm.driver.has_notes

    async def drive(ctl: Ctl) -> None:
        assert await ctl.wait(lambda: ready(ctl) and log_idle(ctl), timeout=10), \
            "never got ready to partition"
        proxy.partition()
        marks["down"] = time.time()
        ctl.server.signal("db_down")
        await asyncio.sleep(PARTITION_S)
        proxy.heal()
        marks["up"] = time.time()
        await ctl.wait(lambda: ctl.script_done(len(scripts) - 1) and not ctl.tap.speaking,
                       timeout=20)
        await ctl.settle(0.5)

    run = await run_call(Flavour("postgres", store), scripts, drive, timeout=60, **options)
    return run, marks["down"], marks["up"]


def _bot_audio_gap(run, down: float, up: float) -> float:
    """The longest silence at the output during the partition; Gemini speaks throughout it
    (the scripts' 3.6 s of audio), so a silence is what the service held back."""
    spoken = [m.at for m in run.connections[0].sent if _is_audio(m.message)]
    assert min(spoken) < down + 0.3 and max(spoken) > up, "Gemini did not speak throughout"
    return _max_gap(run.tap.audio_at, down, up)


async def test_go_away_in_a_partition_holds_no_audio_and_reconnects_once_logged(behind_proxy):
    """goAway arrives the moment the network goes, while nothing else holds the log: the
    receive loop tries to log it, and the bot's audio after it waits for that try. Before
    2026-12-02 the try hung for the whole partition (no audio played); now it is cut at 0.5 s
    and the notes task logs it. The reconnect it asks for waits for the log (its
    `connection.disconnected` first), then resumes from the newest handle before goAway's
    deadline."""
    open_, proxy, _schema = behind_proxy
    scripts = [Script([Audio(chunks=3), TurnComplete(), WaitSignal("db_down", timeout=20),
                       GoAway(time_left=7.0, close_code=1000), Audio(chunks=90, pause_ms=40),
                       TurnComplete()], reply=()),
               Script([Audio(chunks=2), TurnComplete()], reply=())]
    run, down, up = await _call_through_a_partition(
        open_, proxy, scripts, ready=lambda ctl: bool(ctl.tap.speech) and not ctl.tap.speaking,
        policy=Policy(go_away_margin_s=1.0))

    first = run.connections[0]
    go_away_at = next(s.at for s in first.sent if "goAway" in s.message)
    assert down <= go_away_at <= up
    gap = _bot_audio_gap(run, down, up)
    assert gap < 1.5, f"the bot's audio stopped for {gap:.2f}s after the goAway"
    assert len(run.connections) == 2
    assert first.closed_by == "client", f"closed by {first.closed_by} ({first.close_code})"
    assert up <= run.connections[1].opened_at < go_away_at + 7.0
    assert run.connections[1].resumption_handle == handles_of(run.server, 0)[-1]
    assert_server_clean(run)
    assert run.at("connection.go_away", generation=1) < run.at(
        "connection.disconnected", reason="go_away") < run.at("connection.connected",
                                                               generation=2)
    assert_log_settled(run)
    await assert_chain_ok(run)


async def test_cancellation_in_a_partition_holds_no_audio_and_is_never_answered(behind_proxy):
    """c1 runs (1 s); its cancellation arrives the moment the network goes, and c1's result
    during the partition. Neither holds the bot's audio; after it, the log says cancelled,
    and the result is never sent."""
    open_, proxy, _schema = behind_proxy
    scripts = [Script([Audio(chunks=3), TurnComplete(), ToolCall(Call("c1", ORDER, {"id": 1})),
                       WaitSignal("db_down", timeout=20), CancelToolCalls("c1"),
                       Audio(chunks=90, pause_ms=40), TurnComplete()], reply=())]
    run, down, up = await _call_through_a_partition(
        open_, proxy, scripts, ready=lambda ctl: bool(ctl.ledger.runs), tool_delay=1.0)

    gap = _bot_audio_gap(run, down, up)
    assert gap < 1.5, f"the bot's audio stopped for {gap:.2f}s after the cancellation"
    await assert_cancelled_after_start(run, "c1")
