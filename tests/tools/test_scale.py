"""Large logs stay usable: 100,000 calls list right, page by page, each listing reading
heads through their start-time index; a 50,000-event call's pages and states open right.

What they cost is measured, not asserted here: bench/listing.py (the call list, a small
store against a big one) and bench/recovery.py (folding a 50,000-event call).
"""

from __future__ import annotations

import functools
import json

from sqlalchemy.dialects import postgresql, sqlite

from session_store import events as ev
from session_store.audit import CallFilter
from session_store.audit.queries import count_calls, list_calls, page_query
from session_store.events import canonical_json
from session_store.records import GENESIS_HASH

from .conftest import running_viewer, viewer_client, sql
from .helpers import T0, acli, chain, write_rows

CALLS = 100_000
BIG_EVENTS = 50_000
HEADS_BY_START = "ix_session_streams_created_at_us_stream_id"


@functools.cache
def many_calls() -> tuple[list[tuple], list[tuple]]:
    """100,000 short calls a minute apart (2–4 events each: the listing's cost is per call):
    every 10th taken over, every 7th left open."""
    templates = {name: (e.TYPE, e.SCHEMA, canonical_json(e.to_data())) for name, e in {
        "open": ev.SessionOpened("gemini-live", ["lookup_order"], "w1"),
        "conn": ev.Connected(1), "req": ev.ToolCallRequested("c1", "lookup_order", {"id": 1}, 1),
        "done": ev.ToolCallCompleted("c1", {"ok": True}), "take": ev.WorkerAttached("w2", 2),
        "close": ev.SessionClosed()}.items()}
    rows, heads = [], []
    for i in range(CALLS):
        sid, t0 = f"call-{i:06d}", T0 + i * 60_000_000
        names = ["open", "req"] + (["take"] if i % 10 == 0 else []) + (
            ["close"] if i % 7 else [])
        h = GENESIS_HASH
        for v, name in enumerate(names, start=1):
            etype, schema, data = templates[name]
            at_us = t0 + v * 1000
            # Listing never reads hashes: a cheap placeholder keeps the fixture fast (the
            # 50,000-event call below has a real chain).
            h = f"{i:058d}{v:06d}"
            rows.append((0, sid, v, etype, schema, data, at_us, h))
        heads.append((sid, len(names), h, 1, t0 + 1000, t0 + len(names) * 1000))
    return rows, heads


@functools.cache
def big_call() -> list:
    """One call of 50,000 events: turns with deferred tool calls, reconnects every 50 turns."""
    timed, t, i = [(0, ev.SessionOpened("gemini-live", ["lookup"], "w1")), (0, ev.Connected(1))], 0, 0
    gen = 1
    while len(timed) < BIG_EVENTS:
        i += 1
        t += 1000
        c = f"c{i}"
        timed += [(t, ev.BotStartedSpeaking(gen)), (t + 10, ev.ToolCallRequested(c, "lookup",
                                                                                 {"i": i}, gen)),
                  (t + 10, ev.ToolCallDeferred(c)), (t + 400, ev.BotStoppedSpeaking(gen)),
                  (t + 410, ev.ToolCallStarted(c, 1, f"big:{c}", 1)),
                  (t + 600, ev.ToolCallCompleted(c, {"ok": i})),
                  (t + 610, ev.ToolResultSending(c, gen, "tool_response")),
                  (t + 620, ev.ToolResultSent(c, gen, "tool_response")),
                  (t + 700, ev.ConversationMessage("user", f"turn {i}", gen))]
        if i % 50 == 0:
            gen += 1
            timed += [(t + 800, ev.HandleIssued(gen - 1, f"h{gen}")),
                      (t + 900, ev.Disconnected(gen - 1, "go_away")),
                      (t + 950, ev.Connected(gen, f"h{gen}"))]
    recs = chain("big", timed[:BIG_EVENTS])
    rows = [(0, r.stream_id, r.version, r.type, r.schema_version, r.data_json,
             r.recorded_at_us, r.hash) for r in recs]
    head = ("big", recs[-1].version, recs[-1].hash, 1, recs[0].recorded_at_us,
            recs[-1].recorded_at_us)
    return [rows, [head]]


async def plan(backend, stmt) -> str:
    """The database's plan for a listing statement, as text."""
    dialect = sqlite.dialect() if backend.name == "sqlite" else postgresql.dialect()
    query = str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    explain = "EXPLAIN QUERY PLAN " if backend.name == "sqlite" else "EXPLAIN "
    return "\n".join(str(row[-1]) for row in await sql(backend, explain + query))


async def test_listing_100k_calls(migrated):
    await write_rows(migrated, *many_calls())
    # This schema's tables only: a bare ANALYZE on PostgreSQL reads every test's tables.
    await sql(migrated, "ANALYZE" if migrated.name == "sqlite"
              else "ANALYZE session_streams, session_events")
    store = await migrated.open()
    now = T0 + (CALLS + 24 * 60) * 60_000_000  # a day after the last call started
    try:
        for flt in [CallFilter(), CallFilter(status="closed"), CallFilter(status="stale"),
                    CallFilter(takeover=True), CallFilter(search="4242"),
                    CallFilter(since_us=T0 + 90_000 * 60_000_000)]:
            # A page costs what it holds: heads come in start order through their index,
            # never all of them sorted (an id search reads every id, by nature).
            shown = await plan(migrated, page_query(flt, now).limit(flt.limit + 1))
            assert flt.search or (HEADS_BY_START in shown and "TEMP B-TREE" not in shown
                                  and "Sort" not in shown), (flt, shown)
            page = await list_calls(store, flt, now)
            # Ids holding "4242": call-04242d and call-0d4242, 20 in all.
            assert len(page.calls) == (20 if flt.search else flt.limit), flt
        first = await list_calls(store, CallFilter(limit=3), now)
        assert [c.call_id for c in first.calls] == ["call-099999", "call-099998", "call-099997"]
        assert first.next_after == "call-099997"
        deep = await list_calls(store, CallFilter(after="call-050000", limit=2), now)
        assert [c.call_id for c in deep.calls] == ["call-049999", "call-049998"]
        stale = await list_calls(store, CallFilter(status="stale", limit=2), now)
        assert [c.call_id for c in stale.calls] == ["call-099995", "call-099988"]
        taken = await list_calls(store, CallFilter(takeover=True, limit=2), now)
        assert [c.call_id for c in taken.calls] == ["call-099990", "call-099980"]
        assert await count_calls(store, CallFilter(status="closed"), now) == CALLS - 14286
        assert await count_calls(store, CallFilter(status="stale"), now) == 14286
        [left_open] = (await list_calls(store, CallFilter(search="call-099995"), now)).calls
        assert (left_open.status, left_open.events, left_open.tool_calls) == ("stale", 2, 1)
        [taken] = (await list_calls(store, CallFilter(search="call-099990"), now)).calls
        assert (taken.status, taken.takeovers) == ("closed", 1)
    finally:
        await store.close()
    cli = await acli("calls", "--json", "--limit", "20", "--status", "closed", backend=migrated)
    assert cli.exit_code == 0 and len(json.loads(cli.stdout)["calls"]) == 20
    with running_viewer(migrated) as base:
        async with viewer_client(base, timeout=60) as http:
            for path in ["/", "/?status=closed", "/?q=12345"]:
                r = await http.get(path)
                assert r.status_code == 200, (path, r.text[:500])
            assert "100,000 calls match" in (await http.get("/")).text


async def test_a_50k_event_call_opens(migrated):
    await write_rows(migrated, *big_call())
    with running_viewer(migrated) as base:
        async with viewer_client(base, timeout=120) as http:
            # The first open folds all 50,000 events (a window states the whole call's facts:
            # how each tool call ended, whether its result is in the model); later windows
            # start from the checkpoints it left.
            for path in ["/calls/big", "/calls/big", "/calls/big?from=25001",
                         "/calls/big?from=49501"]:
                r = await http.get(path)
                assert r.status_code == 200, r.text[:500]
            assert "of 50,000" in r.text and r.text.count('<tr class="ev') >= 500
            st = (await http.get("/api/state/big", params={"at": 50_000})).json()
            assert st["version"] == 50_000
            st = (await http.get("/api/state/big", params={"at": 49_990})).json()
            assert st["version"] == 49_990 and st["tool_calls_total"] > 5000
    r = await acli("timeline", "big", "--from", "25000", "--limit", "200", "--json",
                   backend=migrated)
    assert r.exit_code == 0 and len(json.loads(r.stdout)["entries"]) == 200
