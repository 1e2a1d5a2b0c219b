"""The audit trail is tamper-evident (I7): edits made behind the log's back with plain SQL are
found by verify(), which names the first bad event and says why; other streams stay ok."""

from __future__ import annotations

import asyncio

import pytest

from session_store import events as ev
from session_store.records import chain_hash
from session_store.audit.verify import verify_log

from ..helpers import msg, opened, sql

N = 6  # events in the tampered stream "t"


@pytest.fixture
async def log(store):
    """Stream "t" with N events (separate appends) and an untouched neighbour "u"."""
    await store.append("u", [opened(), msg(100)], 0)
    await store.append("t", [opened()], 0)
    for v in range(1, N):
        await store.append("t", [msg(v)], v)
    await store.append("u", [msg(101)], 2)
    reports = await verify_log(store)
    assert [(r.stream_id, r.ok, r.events_checked) for r in reports] == [("t", True, N),
                                                                       ("u", True, 3)]
    return store


def _pos(rows, version):
    return next(r.position for r in rows if r.version == version)


async def edit_data(backend, rows):
    await sql(backend, "UPDATE session_events SET data = :d WHERE stream_id = 't' AND version = 3",
              d='{"generation":0,"role":"user","text":"I never said that"}')
    return 3, _pos(rows, 3), "hash mismatch"


async def edit_recorded_at(backend, rows):
    await sql(backend, "UPDATE session_events SET recorded_at_us = recorded_at_us + 1 "
                       "WHERE stream_id = 't' AND version = 4")
    return 4, _pos(rows, 4), "hash mismatch"


async def edit_type(backend, rows):
    await sql(backend, "UPDATE session_events SET type = 'anomaly.recorded' "
                       "WHERE stream_id = 't' AND version = 2")
    return 2, _pos(rows, 2), "hash mismatch"


async def delete_middle(backend, rows):
    await sql(backend, "DELETE FROM session_events WHERE stream_id = 't' AND version = 3")
    return 3, _pos(rows, 4), "version 3 is missing"


async def delete_last(backend, rows):
    await sql(backend, f"DELETE FROM session_events WHERE stream_id = 't' AND version = {N}")
    return N, None, f"head says version {N} but {N - 1} events"


async def delete_last_and_fix_head(backend, rows):
    """Truncate the tail and move the head back too: the head's hash gives it away."""
    await sql(backend, f"DELETE FROM session_events WHERE stream_id = 't' AND version = {N}")
    await sql(backend, f"UPDATE session_streams SET version = {N - 1} WHERE stream_id = 't'")
    return N - 1, _pos(rows, N - 1), "does not match the head"


async def swap_payloads(backend, rows):
    """Swap type and data of versions 1 and 4 (the rows keep their versions and hashes)."""
    a, b = [(await sql(backend, "SELECT type, data FROM session_events WHERE stream_id = 't' "
                                f"AND version = {v}"))[0] for v in (1, 4)]
    assert a[0] != b[0] and a[1] != b[1]
    for (t, d), v in ((b, 1), (a, 4)):
        await sql(backend, "UPDATE session_events SET type = :t, data = :d "
                           "WHERE stream_id = 't' AND version = :v", t=t, d=d, v=v)
    return 1, _pos(rows, 1), "hash mismatch"


async def swap_versions(backend, rows):
    """Renumber rows 2 and 4 into each other's place (whole rows, hashes included)."""
    for old, new in ((2, -2), (4, 2), (-2, 4)):
        await sql(backend, "UPDATE session_events SET version = :n "
                           "WHERE stream_id = 't' AND version = :o", n=new, o=old)
    return 2, _pos(rows, 4), "hash mismatch"


async def swap_positions(backend, rows):
    """Give versions 2 and 3 each other's global positions (no hash covers a position): the
    global order now puts version 3 before version 2."""
    p2, p3 = _pos(rows, 2), _pos(rows, 3)
    for old, new in ((p2, -1), (p3, p2), (-1, p3)):
        await sql(backend, "UPDATE session_events SET position = :n WHERE position = :o",
                  n=new, o=old)
    return 3, p2, "position goes backwards"

async def append_behind_the_back(backend, rows):
    """A well-chained extra event inserted without moving the head."""
    last = rows[-1]
    data = '{"generation":0,"role":"user","text":"added later"}'
    h = chain_hash(last.hash, "t", N + 1, "conversation.message", 1, last.recorded_at_us + 1,
                   data)
    await sql(backend, "INSERT INTO session_events (tx_order, stream_id, version, type, "
                       "schema_version, data, recorded_at_us, hash) VALUES (0, 't', :v, "
                       "'conversation.message', 1, :d, :at, :h)",
              v=N + 1, d=data, at=last.recorded_at_us + 1, h=h)
    return N + 1, None, f"head says version {N} but {N + 1} events"


async def drop_head_row(backend, rows):
    await sql(backend, "DELETE FROM session_streams WHERE stream_id = 't'")
    return N, None, "no head row"


async def raise_head_epoch(backend, rows):
    """The head's fencing epoch set above every epoch the call's events record: verify said
    ok, and the next takeover refused the call ("run session-store verify")."""
    await sql(backend, "UPDATE session_streams SET epoch = 7 WHERE stream_id = 't'")
    return N, _pos(rows, N), "the head says fencing epoch 7 but the log records epoch 1"


SCENARIOS = [edit_data, edit_recorded_at, edit_type, delete_middle, delete_last,
             delete_last_and_fix_head, swap_payloads, swap_versions, swap_positions,
             append_behind_the_back, drop_head_row, raise_head_epoch]


@pytest.mark.parametrize("tamper", SCENARIOS, ids=[f.__name__ for f in SCENARIOS])
async def test_verify_finds_the_first_bad_event(log, migrated, tamper):
    rows = await log.read("t")
    bad_version, bad_position, reason = await tamper(migrated, rows)

    report, = await verify_log(log, "t")
    assert not report.ok
    assert report.first_bad_version == bad_version, report
    assert report.first_bad_position == bad_position, report
    assert reason in report.reason, report
    assert report.to_json()["ok"] is False

    by_id = {r.stream_id: r for r in await verify_log(log)}
    assert set(by_id) == {"t", "u"}
    assert by_id["t"] == report
    assert by_id["u"].ok and by_id["u"].events_checked == 3
    untouched, = await verify_log(log, "u")
    assert untouched.ok


async def test_verify_detects_rewritten_hash_of_one_row(log, migrated):
    """Re-hashing only the edited row moves the break to the next row, which names it."""
    rows = await log.read("t")
    r3 = rows[2]
    data = '{"generation":0,"role":"user","text":"forged"}'
    forged = chain_hash(rows[1].hash, "t", 3, r3.type, r3.schema_version, r3.recorded_at_us,
                        data)
    await sql(migrated, "UPDATE session_events SET data = :d, hash = :h "
                        "WHERE stream_id = 't' AND version = 3", d=data, h=forged)
    report, = await verify_log(log, "t")
    assert (report.ok, report.first_bad_version, report.events_checked) == (False, 4, 3)
    assert "altered, or the one before it" in report.reason


async def test_verify_detects_a_stream_renamed_as_a_whole(log, migrated):
    """Events and head moved to another stream id, all else intact: the hashes cover the
    stream id, so the chain breaks at the first event (one call's log passed off as
    another's)."""
    rows = await log.read("u")
    for table in ("session_events", "session_streams"):
        await sql(migrated, f"UPDATE {table} SET stream_id = 'v' WHERE stream_id = 'u'")
    report, = await verify_log(log, "v")
    assert (report.ok, report.first_bad_version, report.first_bad_position) == (
        False, 1, rows[0].position)
    assert "hash mismatch" in report.reason

async def test_untampered_stream_verifies_and_empty_store_has_no_reports(store):
    assert await verify_log(store) == []
    assert await store.append("x", [opened(), ev.Connected(1)], 0) == 2
    report, = await verify_log(store, "x")
    assert report.ok and report.events_checked == 2 and report.first_bad_version is None
    nothing, = await verify_log(store, "missing")
    assert nothing.ok and nothing.events_checked == 0


@pytest.mark.timeout(60)
async def test_verify_on_a_live_log_never_reports_appends_as_tampering(migrated):
    """`verify` read the head row and the events in two statements: an append committing
    between them (a live call, a support engineer verifying) made an intact stream
    "damaged" ("the head says version 3 but 4 events are stored ... added behind the log's
    back"). Seen within a few hundred verifies on both databases."""
    if migrated.options.get("inline"):
        # Inline appends commit on this test's own loop, between two verifies, faster than
        # verifies of the whole, growing stream can follow: 300 of them outlast the timeout.
        pytest.skip("the race needs appends that leave the loop to the verifies")
    store, writer = await migrated.open(), await migrated.open()
    try:
        await writer.append("s", [opened()], 0)
        stop = asyncio.Event()

        appended = [1]

        async def append_on():
            while not stop.is_set():
                appended[0] = await writer.append("s", [msg(appended[0])], appended[0])

        appending = asyncio.ensure_future(append_on())
        false_alarms, verifies = [], 0
        # Until both sides did enough: counted in verifies alone, a loaded machine once let
        # 300 of them pass during 6 appends, and the race was hardly exercised.
        deadline = asyncio.get_running_loop().time() + 60
        while (verifies < 300 or appended[0] <= 30) \
                and asyncio.get_running_loop().time() < deadline:
            report, = await verify_log(store, "s")
            verifies += 1
            if not report.ok:
                false_alarms.append(report.reason)
        stop.set()
        await appending
        assert appended[0] > 30, "the appends did not run alongside"
        assert false_alarms == [], f"{len(false_alarms)} false alarms, e.g. {false_alarms[0]}"
    finally:
        await writer.close()
        await store.close()
