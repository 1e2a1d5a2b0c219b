"""Append / read contract of the log, on SQLite and PostgreSQL (the `store` fixture runs both).

Streams are ordered and gap-free (I7), appends are optimistic (expected version), fenced by
epoch (I6), group-committed, and durable on return.
"""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta, timezone

import pytest

from session_store import events as ev
from session_store.errors import ConcurrencyConflict, Fenced, StoreClosed, StoreUnavailable
from session_store.events import MAX_NESTING
from session_store.storage import Snapshot
from session_store.audit.verify import verify_log

from ..helpers import msg, opened


def _events(n: int, start: int = 0) -> list[ev.Event]:
    return [msg(start + i) for i in range(n)]


# --------------------------------------------------------------------------- round trip

async def test_append_read_round_trip(store):
    written = [opened(), ev.Connected(generation=1),
               ev.ToolCallRequested("c1", "lookup", {"q": "ünïcode", "n": [1, 2.5, None]}, 1),
               ev.HandleIssued(1, "h-1", last_consumed_client_message_index=7)]
    before = datetime.now(timezone.utc)
    assert await store.append("call-1", written[:2], 0) == 2
    assert await store.append("call-1", written[2:], 2) == 4
    after = datetime.now(timezone.utc)

    got = await store.read("call-1")
    assert [r.version for r in got] == [1, 2, 3, 4]
    assert [r.event for r in got] == written
    assert [r.type for r in got] == [e.TYPE for e in written]
    assert [r.schema_version for r in got] == [e.SCHEMA for e in written]
    assert got[2].data == {"call_id": "c1", "name": "lookup", "generation": 1,
                           "args": {"q": "ünïcode", "n": [1, 2.5, None]},
                           "mode": "blocking", "declared": None}
    positions = [r.position for r in got]
    assert positions == sorted(positions) and len(set(positions)) == 4
    for r in got:
        assert r.stream_id == "call-1"
        assert before - timedelta(seconds=1) <= r.recorded_at <= after + timedelta(seconds=1)
        assert r.recorded_at.tzinfo is not None
        assert len(r.hash) == 64
    # One append = one recorded_at; the next append is not earlier.
    assert got[0].recorded_at_us == got[1].recorded_at_us <= got[2].recorded_at_us


async def test_read_version_window(store):
    await store.append("s", _events(10), 0)
    assert [r.version for r in await store.read("s", from_version=4)] == list(range(4, 11))
    assert [r.version for r in await store.read("s", 3, 6)] == [3, 4, 5, 6]
    assert [r.version for r in await store.read("s", 5, 5)] == [5]
    assert [r.version for r in await store.read("s", 2, limit=3)] == [2, 3, 4]
    assert await store.read("s", from_version=11) == []
    assert await store.read("no-such-stream") == []


async def test_versions_gap_free_and_stream_version(store):
    assert await store.stream_version("s") == 0
    v = 0
    for n in (1, 3, 1, 5):
        v = await store.append("s", _events(n, v), v)
    assert v == 10 and await store.stream_version("s") == 10
    got = await store.read("s")
    assert [r.version for r in got] == list(range(1, 11))
    assert [r.event.text for r in got] == [f"turn {i}" for i in range(10)]


@pytest.mark.tails
async def test_read_all_global_order_and_continuation(store):
    expected = []
    for i in range(30):
        sid = f"s{i % 4}"
        v = await store.stream_version(sid)
        await store.append(sid, [msg(i)], v)
        expected.append((sid, f"turn {i}"))
    everything = await store.read_all()
    assert [(r.stream_id, r.event.text) for r in everything] == expected
    assert [r.position for r in everything] == sorted(r.position for r in everything)

    # Continue from the last position seen, in pages.
    seen, last = [], 0
    while page := await store.read_all(from_position=last, limit=7):
        assert len(page) <= 7
        seen += page
        last = page[-1].position
    assert [r.position for r in seen] == [r.position for r in everything]

    middle = everything[11].position
    assert [r.position for r in await store.read_all(middle)] == [
        r.position for r in everything[12:]]
    assert await store.read_all(everything[-1].position) == []


async def test_read_all_from_a_position_no_event_has_is_an_error_not_a_replay(store):
    """A position that names no event (a log restored from an older backup, a checkpoint
    from another database) has no place in the global order. read_all answered it with
    the whole log from the start: a follower would process every event a second time."""
    for i in range(3):
        await store.append("s", [msg(i)], i)
    last = (await store.read("s"))[-1].position  # (read_all may hold rows back: PostgreSQL)
    with pytest.raises(ValueError, match="no event at position"):
        await store.read_all(last + 50)
    with pytest.raises(ValueError, match="no event at position"):
        async for _ in store.subscribe(last + 50):
            pass
    assert await store.read_all(last) == []
    assert [r.version for r in await store.read_all(0)] == [1, 2, 3]


# --------------------------------------------------------------------------- expected version

async def test_new_stream_needs_expected_version_zero(store):
    with pytest.raises(ConcurrencyConflict) as err:
        await store.append("fresh", [msg(1)], 1)
    assert (err.value.stream_id, err.value.expected, err.value.actual) == ("fresh", 1, 0)
    assert await store.read("fresh") == [] and await store.stream_version("fresh") == 0
    assert await store.append("fresh", [msg(1)], 0) == 1


async def test_conflict_when_version_moved(store):
    await store.append("s", _events(3), 0)
    for stale in (0, 2, 4):
        with pytest.raises(ConcurrencyConflict) as err:
            await store.append("s", [msg(9)], stale)
        assert (err.value.expected, err.value.actual) == (stale, 3)
        assert "expected version" in str(err.value)
    assert await store.stream_version("s") == 3  # nothing written by the failed appends
    assert len(await store.read("s")) == 3


@pytest.mark.timeout(60)
async def test_racing_appends_one_winner_per_version(migrated):
    """20 appenders on 4 store instances (own connections / writer processes) race at the same
    expected version, over and over: exactly one wins each version."""
    stores = [await migrated.open() for _ in range(4)]
    try:
        for expected in range(8):
            async def attempt(k: int):
                return await stores[k % 4].append("race", [msg(k)], expected)

            results = await asyncio.gather(*(attempt(k) for k in range(20)),
                                           return_exceptions=True)
            winners = [r for r in results if not isinstance(r, BaseException)]
            losers = [r for r in results if isinstance(r, BaseException)]
            assert winners == [expected + 1], results
            assert all(type(e) is ConcurrencyConflict for e in losers), losers
            assert all(e.expected == expected and e.actual == expected + 1 for e in losers)
        got = await stores[0].read("race")
        assert [r.version for r in got] == list(range(1, 9))
        report, = await verify_log(stores[0], "race")
        assert report.ok and report.events_checked == 8
    finally:
        for s in stores:
            await s.close()


@pytest.mark.timeout(60)
async def test_racing_read_decide_append_loops_stay_gap_free(migrated):
    """Writers that re-read and retry on conflict: every success gets a distinct version and
    together they fill 1..n with no gap and no loss."""
    stores = [await migrated.open() for _ in range(4)]
    won: dict[int, tuple[int, int]] = {}

    async def writer(k: int):
        s = stores[k % 4]
        for i in range(5):
            while True:
                v = await s.stream_version("shared")
                try:
                    new = await s.append("shared", [msg(k * 100 + i)], v)
                except ConcurrencyConflict as exc:
                    assert exc.actual is not None and exc.actual > v
                    continue
                assert new == v + 1 and new not in won
                won[new] = (k, i)
                break

    try:
        await asyncio.gather(*(writer(k) for k in range(12)))
        got = await stores[0].read("shared")
        assert [r.version for r in got] == list(range(1, 61)) == sorted(won)
        assert {r.event.text for r in got} == {f"turn {k * 100 + i}" for k in range(12)
                                               for i in range(5)}
        assert [r.event.text for r in got] == [f"turn {k * 100 + i}"
                                               for k, i in (won[v] for v in range(1, 61))]
    finally:
        for s in stores:
            await s.close()


# --------------------------------------------------------------------------- group commit

@pytest.mark.timeout(60)
async def test_group_commit_shares_batches_and_acks_each_caller(store):
    rng = random.Random(7)
    base = {f"g{i}": rng.randint(0, 3) for i in range(200)}
    for sid, n in base.items():  # give most streams some history first
        if n:
            await store.append(sid, _events(n), 0)
    batches_before = store.stats["batches"]
    sizes = {sid: rng.randint(1, 3) for sid in base}

    results = await asyncio.gather(*(store.append(sid, _events(sizes[sid], 50), base[sid])
                                     for sid in base))
    batches = store.stats["batches"] - batches_before
    assert batches < 200 / 4, f"200 concurrent appends took {batches} commits"
    assert results == [base[sid] + sizes[sid] for sid in base]
    for sid in base:
        got = await store.read(sid)
        assert [r.version for r in got] == list(range(1, base[sid] + sizes[sid] + 1))
        assert [r.event.text for r in got[base[sid]:]] == [f"turn {50 + i}"
                                                          for i in range(sizes[sid])]


async def test_conflict_inside_one_batch_fails_only_that_request(store):
    await store.append("b", [msg(0)], 0)
    batches_before = store.stats["batches"]
    results = await asyncio.gather(
        store.append("a", [msg(1)], 0),
        store.append("a", [msg(2)], 0),      # same stream, same expected version: loses
        store.append("b", [msg(3)], 1),
        store.append("a", [msg(4)], 1),      # chains onto the first request in the batch
        store.append("c", [msg(5), msg(6)], 0),
        store.append("b", [msg(7)], 0),      # stale
        return_exceptions=True)
    assert store.stats["batches"] - batches_before == 1, "the requests were not one batch"
    assert results[0] == 1 and results[2] == 2 and results[3] == 2 and results[4] == 2
    assert type(results[1]) is ConcurrencyConflict
    assert (results[1].expected, results[1].actual) == (0, 1)
    assert type(results[5]) is ConcurrencyConflict
    assert (results[5].expected, results[5].actual) == (0, 2)
    assert [r.event.text for r in await store.read("a")] == ["turn 1", "turn 4"]
    assert [r.event.text for r in await store.read("b")] == ["turn 0", "turn 3"]
    assert [r.event.text for r in await store.read("c")] == ["turn 5", "turn 6"]
    assert all(rep.ok for rep in await verify_log(store))


@pytest.mark.parametrize("bad_stream, bad_text", [
    ("x" * 256, "fine"),               # longer than the stream_id column (PostgreSQL refuses)
    ("nul\x00in the id", "fine"),      # PostgreSQL text cannot hold NUL
    ("s", "a lone \ud800 surrogate"),  # not UTF-8: neither driver can send it
    ("", "fine"),                      # no id at all (SQLite stored it, PostgreSQL too)
], ids=["long-id", "nul-id", "surrogate", "empty-id"])
async def test_an_unstorable_append_fails_alone_not_the_batch_it_shares(store, bad_stream,
                                                                       bad_text):
    """Group commit: each caller gets its own outcome. An append the database cannot store
    failed every other append of its batch (other calls' events, on either database) with
    its own error; it must fail alone, clearly, and write nothing."""
    await store.append("good", [msg(0)], 0)
    batches_before = store.stats["batches"]
    results = await asyncio.gather(
        store.append("good", [msg(1)], 1),
        store.append(bad_stream, [ev.ConversationMessage("user", bad_text)], 0),
        store.append("other", [msg(2), msg(3)], 0),
        return_exceptions=True)
    assert results[0] == 2 and results[2] == 2, results
    assert isinstance(results[1], ValueError), results[1]
    assert store.stats["batches"] - batches_before <= 1
    assert [r.event.text for r in await store.read("good")] == ["turn 0", "turn 1"]
    assert [r.event.text for r in await store.read("other")] == ["turn 2", "turn 3"]
    assert {h.stream_id for h in await store.list_streams()} == {"good", "other"}
    assert all(rep.ok for rep in await verify_log(store))


INVALID_IDS = ["", "x" * 256, "nul\x00in the id", "a lone \ud800 surrogate"]


@pytest.mark.parametrize("bad_id", INVALID_IDS, ids=["empty", "long", "nul", "surrogate"])
async def test_an_invalid_stream_id_is_refused_by_every_read_of_one_stream(store, bad_id):
    """The same rule as appends, on both databases: an empty id was stored and read back,
    a NUL answered "nothing" on SQLite and a driver error on PostgreSQL, a lone surrogate a
    UnicodeEncodeError on SQLite."""
    await store.append("good", [msg(0)], 0)
    for read in (store.read(bad_id), store.stream_version(bad_id), store.stream_head(bad_id),
                 store.load_snapshot(bad_id), verify_log(store, bad_id),
                 store.save_snapshot(Snapshot(bad_id, 1, 1, "{}")),
                 anext(store.subscribe(stream_id=bad_id))):
        with pytest.raises(ValueError, match="a stream id must be valid UTF-8 text of 1 to"):
            await read
    with pytest.raises(ValueError, match="a stream id must be valid UTF-8 text of 1 to"):
        await store.append(bad_id, [msg(1)], 0)
    assert [h.stream_id for h in await store.list_streams()] == ["good"]


def _nested(depth: int):
    value: object = "leaf"
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


@pytest.mark.parametrize("depth", [MAX_NESTING - 1, 900, 5000])
async def test_a_payload_nested_deeper_than_the_log_takes_is_refused(store, depth):
    """Nested a few hundred levels deep, a tool result was stored and then broke every reader
    (RecursionError); past Python's own limit the append raised RecursionError. Now both are
    a ValueError saying why, nothing written. MAX_NESTING levels are taken, the event's own
    objects counted (here two: the event's and its detail's)."""
    with pytest.raises(ValueError, match=f"nested deeper than the {MAX_NESTING} levels"):
        await store.append("s", [ev.AnomalyRecorded("x", {"v": _nested(depth)}, 1)], 0)
    assert await store.read("s") == [] and await store.list_streams() == []
    deepest = _nested(MAX_NESTING - 2)
    assert await store.append("s", [ev.AnomalyRecorded("x", {"v": deepest}, 1)], 0) == 1
    assert (await store.read("s"))[0].event.detail == {"v": deepest}
    assert all(rep.ok for rep in await verify_log(store))


async def test_an_append_the_database_refuses_in_a_shared_commit_fails_alone(store):
    """An epoch beyond 64 bits passes the checks made before queueing, and the database
    refuses it inside the group commit it shares with another caller's append: the batch is
    committed again request by request, so only that append fails, with its own error (not
    as an outage), and the other commits."""
    retries = store.stats["retries"]
    results = await asyncio.gather(store.append("a", [msg(0)], 0, epoch=2 ** 63),
                                   store.append("b", [msg(1)], 0), return_exceptions=True)
    assert isinstance(results[0], Exception), results
    assert not isinstance(results[0], (StoreUnavailable, ConcurrencyConflict)), results
    assert results[1] == 1, results
    assert store.stats["retries"] > retries  # they shared a commit, then went alone
    assert await store.stream_version("a") == 0
    assert [r.event.text for r in await store.read("b")] == ["turn 1"]


@pytest.mark.parametrize("at", [1_750_000_000_000_000.0, "1750000000000000", True, 2 ** 63])
async def test_a_recorded_time_that_is_not_a_64_bit_integer_is_refused(store, at):
    """The hash covers str(recorded_at_us), the column stores an integer: a float time was
    acknowledged, stored as 1750000000000000 and hashed as "1750000000000000.0", and the
    stream failed `verify` for good (the audit trail said it was tampered with)."""
    with pytest.raises((TypeError, ValueError)):
        await store.append("s", [msg(0)], 0, recorded_at_us=at)
    assert await store.read("s") == [] and await store.list_streams() == []
    assert await store.append("s", [msg(1)], 0, recorded_at_us=1_750_000_000_000_000) == 1
    assert all(rep.ok for rep in await verify_log(store))



@pytest.mark.parametrize("epoch", [1.5, True, "2"])
async def test_an_epoch_that_is_not_an_integer_is_refused(store, epoch):
    """A fencing epoch is an integer on both databases: SQLite stored 1.5 in the head row
    and fenced with it, where PostgreSQL refused the append (the same rule on both, said
    before the append shares a commit with others)."""
    with pytest.raises(TypeError):
        await store.append("s", [msg(0)], 0, epoch=epoch)
    assert await store.read("s") == [] and await store.list_streams() == []
    assert await store.append("s", [msg(1)], 0, epoch=2) == 1
    assert (await store.list_streams())[0].epoch == 2

# --------------------------------------------------------------------------- fencing (I6)

async def test_fenced_old_epoch_cannot_append_even_at_right_version(store):
    assert await store.append("call", [opened(epoch=1)], 0, epoch=1) == 1
    assert await store.append("call", [ev.WorkerAttached("w2", 2)], 1, epoch=2) == 2
    with pytest.raises(Fenced) as err:
        await store.append("call", [msg(1)], 2, epoch=1)
    assert isinstance(err.value, ConcurrencyConflict)  # callers catching conflicts see it too
    assert (err.value.epoch, err.value.current_epoch) == (1, 2)
    assert "fenced" in str(err.value)
    assert await store.stream_version("call") == 2
    assert await store.append("call", [msg(2)], 2, epoch=2) == 3  # the new owner goes on
    assert await store.append("call", [msg(3)], 3, epoch=3) == 4
    with pytest.raises(Fenced):
        await store.append("call", [msg(4)], 4, epoch=2)
    heads = {h.stream_id: h for h in await store.list_streams()}
    assert heads["call"].epoch == 3 and heads["call"].version == 4


async def test_fenced_inside_one_batch(store):
    results = await asyncio.gather(store.append("f", [msg(1)], 0, epoch=2),
                                   store.append("f", [msg(2)], 1, epoch=1),
                                   return_exceptions=True)
    assert results[0] == 1 and type(results[1]) is Fenced


# --------------------------------------------------------------------------- misuse / lifecycle

async def test_empty_append_is_rejected(store):
    with pytest.raises(ValueError):
        await store.append("s", [], 0)
    assert await store.stream_version("s") == 0 and await store.list_streams() == []


@pytest.mark.parametrize("option, value, says", [
    ("append_timeout", -1, "append_timeout must be a number of seconds > 0"),
    ("append_timeout", 0, "append_timeout must be a number of seconds > 0"),
    ("append_timeout", float("inf"), "append_timeout"),
    ("attempt_timeout", -0.5, "attempt_timeout must be a number of seconds > 0 or None"),
    ("max_batch_events", 0, "max_batch_events must be a whole number >= 1"),
    ("max_batch_events", 2.5, "max_batch_events"),
    ("writers", -2, "writers must be a whole number >= 1 or None"),
])
async def test_an_option_read_wrong_is_refused_at_open(migrated, option, value, says):
    """A negative timeout failed every append at once; max_batch_events=0 took batches of
    one, silently: refused when the store is opened, naming the option."""
    with pytest.raises(ValueError) as err:
        store = await migrated.open(**{option: value})
        await store.close()
    assert says in str(err.value)
    store = await migrated.open(**{option: None if option in ("attempt_timeout", "writers")
                                   else 1})  # the control: a good value opens
    await store.close()


async def test_closed_store_raises_store_closed(migrated):
    s = await migrated.open()
    await s.append("s", [msg(1)], 0)
    await s.close()
    await s.close()  # idempotent
    with pytest.raises(StoreClosed):
        await s.append("s", [msg(2)], 1)
    # Reads too (errors.StoreClosed: "nothing more can be appended or read"); a read must not
    # quietly re-open a connection pool that nobody will ever dispose of.
    for read in (s.read("s"), s.read_all(), s.stream_version("s"), s.list_streams(),
                 verify_log(s), s.load_snapshot("s")):
        with pytest.raises(StoreClosed):
            await read
    reopened = await migrated.open()
    try:
        assert await reopened.stream_version("s") == 1
    finally:
        await reopened.close()


@pytest.mark.tails
async def test_close_waits_for_queued_appends(migrated):
    s = await migrated.open()
    pending = [asyncio.ensure_future(s.append(f"q{i}", [msg(i)], 0)) for i in range(50)]
    await asyncio.sleep(0)
    await s.close()
    assert await asyncio.gather(*pending) == [1] * 50
    reopened = await migrated.open()
    try:
        assert len(await reopened.read_all(limit=100)) == 50
    finally:
        await reopened.close()


async def test_list_streams(store):
    for sid, n in (("b", 2), ("a", 1), ("c", 3)):
        await store.append(sid, _events(n), 0, epoch=5 if sid == "c" else None)
    heads = await store.list_streams()
    assert [(h.stream_id, h.version) for h in heads] == [("a", 1), ("b", 2), ("c", 3)]
    assert heads[2].epoch == 5 and heads[0].epoch == 0
    assert all(h.created_at_us <= h.updated_at_us for h in heads)
    assert [h.stream_id for h in await store.list_streams(limit=2)] == ["a", "b"]
    assert [h.stream_id for h in await store.list_streams(after="a")] == ["b", "c"]
    before = heads[1].updated_at_us
    await store.append("b", [msg(9)], 2)
    b, = [h for h in await store.list_streams() if h.stream_id == "b"]
    assert b.version == 3 and b.updated_at_us >= before


@pytest.mark.timeout(60)
async def test_two_writers_creating_the_same_streams_do_not_deadlock(migrated):
    """Two store instances create the same new streams in opposite order, in big batches.
    Each stream gets exactly one winner; the loser of each is told ConcurrencyConflict, never
    a database error (before the fix, PostgreSQL aborted one batch with a deadlock)."""
    s1, s2 = await migrated.open(), await migrated.open()
    try:
        for rnd in range(4):
            ids = [f"r{rnd}-{i:03d}" for i in range(300)]
            results = await asyncio.gather(
                *(s1.append(sid, [msg(1)], 0) for sid in ids),
                *(s2.append(sid, [msg(2)], 0) for sid in reversed(ids)),
                return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert all(type(e) is ConcurrencyConflict for e in errors), {
                type(e).__name__ for e in errors}
            assert len(errors) == 300 and results.count(1) == 300
            for sid in ids[::50]:
                assert [r.version for r in await s1.read(sid)] == [1]
    finally:
        await s1.close()
        await s2.close()


# --------------------------------------------------------------------------- direct commits

async def test_an_append_to_an_idle_store_commits_from_its_caller(store):
    """No writer task in between (`_append_direct`); what comes meanwhile still batches."""
    if store.commits_urgent_inline:
        pytest.skip("an idle append commits inline on this backend: no direct commit")
    before = dict(store.stats)
    assert await store.append("u", [msg(0)], 0, urgent=True) == 1
    assert store.stats["direct"] - before["direct"] == 1
    # Ten at once: the first commits from its caller, the nine others queue meanwhile and
    # share one commit of the writer tasks (PostgreSQL's two may split them).
    results = await asyncio.gather(*(store.append(f"v{i}", [msg(i)], 0, urgent=True)
                                     for i in range(10)))
    assert results == [1] * 10
    assert store.stats["direct"] - before["direct"] == 2
    assert store.stats["batches"] - before["batches"] <= 4
    # Not urgent, alone: the same, after a turn of the loop; issued together, they find
    # each other in that turn and share the writer tasks' commits, none of them direct.
    assert await store.append("u", [msg(1)], 1) == 2
    assert store.stats["direct"] - before["direct"] == 3
    batches = store.stats["batches"]
    results = await asyncio.gather(*(store.append(f"w{i}", [msg(i)], 0) for i in range(10)))
    assert results == [1] * 10
    assert store.stats["direct"] - before["direct"] == 3
    assert store.stats["batches"] - batches <= 2
    assert [r.event.text for r in await store.read("u")] == ["turn 0", "turn 1"]
    # Conflicts and fencing are the database's answers on this path too.
    with pytest.raises(ConcurrencyConflict):
        await store.append("u", [msg(2)], 1, urgent=True)
    assert await store.append("u", [msg(2)], 2, epoch=3, urgent=True) == 3
    with pytest.raises(Fenced):
        await store.append("u", [msg(3)], 3, epoch=2, urgent=True)
    assert all(r.ok for r in await verify_log(store))


async def test_an_append_handed_back_by_a_failed_direct_commit_still_goes_first(migrated):
    """A commits from its caller; meanwhile B, chained onto it (expected version 1), queues
    and the writer task takes it, then waits for A's direct commit. That commit fails and A
    is handed to the writer, behind B in the batch: the batch commits in acceptance order,
    so A gets version 1 and B version 2 (in B-then-A order, B was refused as a conflict)."""
    if migrated.options.get("inline"):
        pytest.skip("an idle append commits inline on this backend: no direct commit")
    store = await migrated.open(writers=1)
    committer = store._committer
    real, gate, tries = committer.run_batch, asyncio.Event(), []

    async def first_try_fails(batch, cached):
        tries.append([r.expected_version for r in batch])
        if len(tries) == 1:
            await gate.wait()
            raise RuntimeError("the direct commit failed")  # not an outage: handed over
        return await real(batch, cached)

    committer.run_batch = first_try_fails
    try:
        a = asyncio.ensure_future(store.append("s", [msg(0)], 0, urgent=True))
        for _ in range(100):
            if tries:
                break
            await asyncio.sleep(0)
        assert tries == [[0]] and store._commits._direct == 1  # A is committing from its caller
        b = asyncio.ensure_future(store.append("s", [msg(1)], 1))
        for _ in range(100):
            await asyncio.sleep(0)
            if store._commits._inflight == 2 and store._commits._queue.empty():
                break
        # B taken by the writer task:
        assert store._commits._inflight == 2 and store._commits._queue.empty()
        gate.set()
        assert await asyncio.wait_for(a, 10) == 1
        assert await asyncio.wait_for(b, 10) == 2
        assert tries == [[0], [0, 1]]
        assert [r.event.text for r in await store.read("s")] == ["turn 0", "turn 1"]
    finally:
        gate.set()
        await store.close()

async def test_closing_waits_for_a_direct_append_under_way(migrated):
    if migrated.options.get("inline"):
        pytest.skip("an idle append commits inline on this backend: no direct commit")
    store = await migrated.open()
    appending = asyncio.ensure_future(store.append("w", [msg(0)], 0, urgent=True))
    await asyncio.sleep(0)  # it is committing from its caller
    assert store._commits._direct == 1
    await store.close()
    assert appending.result() == 1
    reopened = await migrated.open()
    try:
        assert [r.version for r in await reopened.read("w")] == [1]
    finally:
        await reopened.close()


async def test_a_read_only_store_reads_and_refuses_every_write(migrated, store):
    """What the tools open (`read_only=True`): no writer (SQLite: no writer process), the
    same reads, and every write refused before it reaches the database."""
    await store.append("s", [opened(), msg(1)], 0)
    reader = await migrated.open(read_only=True)
    try:
        assert [r.version for r in await reader.read("s")] == [1, 2]
        assert (await verify_log(reader, "s"))[0].ok
        writer = getattr(reader._committer, "_writer", None)  # (SQLite's writer process)
        assert writer is None or writer._child is None
        for write in (reader.append("s", [msg(2)], 2), reader.append("t", [msg(0)], 0),
                      reader.take_over("s", [ev.WorkerAttached("w2", 2)], 2, after_version=2),
                      reader.save_snapshot(Snapshot("s", 2, 1, "{}"))):
            with pytest.raises(StoreClosed, match="opened read_only"):
                await write
    finally:
        await reader.close()
    assert await store.stream_version("s") == 2 and await store.list_streams() != []
