"""Large logs stay usable: 100,000 calls list fast; a 50,000-event call's page opens fast.

Timings are printed (run with -s) and written to test-artifacts/tools/timings-BACKEND.json;
the assertions are generous (these machines are noisy): the goal is < 1 s.
"""

from __future__ import annotations

import functools
import json
import time

import httpx

from session_store import events as ev
from session_store.audit import CallFilter
from session_store.audit.queries import count_calls, list_calls
from session_store.events import canonical_json
from session_store.records import GENESIS_HASH

from .conftest import running_viewer
from .helpers import T0, acli, chain, write_rows

CALLS = 100_000
BIG_EVENTS = 50_000
BOUND_S = 3.0


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


def timed_s(t0: float) -> float:
    return round(time.perf_counter() - t0, 4)


def report(backend, artifacts, name: str, timings: dict) -> None:
    path = artifacts / f"timings-{backend.name}.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = timings
    path.write_text(json.dumps(data, indent=2))
    print(f"\n{backend.name} {name}: {json.dumps(timings)}")


async def test_listing_100k_calls(migrated, artifacts):
    await write_rows(migrated, *many_calls())
    store = await migrated.open()
    timings, now = {}, time.time_ns() // 1000
    try:
        for name, flt in [("first page", CallFilter()),
                          ("page after call-050000", CallFilter(after="call-050000")),
                          ("status closed", CallFilter(status="closed")),
                          ("status stale", CallFilter(status="stale", limit=20)),
                          ("search 4242", CallFilter(search="4242")),
                          ("since", CallFilter(since_us=T0 + 90_000 * 60_000_000))]:
            t = time.perf_counter()
            page = await list_calls(store, flt, now)
            timings[name] = timed_s(t)
            assert page.calls and timings[name] < BOUND_S, (name, timings)
        first = await list_calls(store, CallFilter(limit=3), now)
        assert [c.call_id for c in first.calls] == ["call-099999", "call-099998", "call-099997"]
        assert first.next_after == "call-099997"
        deep = await list_calls(store, CallFilter(after="call-050000", limit=2), now)
        assert [c.call_id for c in deep.calls] == ["call-049999", "call-049998"]
        t = time.perf_counter()
        assert await count_calls(store, CallFilter(status="closed"), now) == CALLS - 14286
        timings["count status closed"] = timed_s(t)
        [left_open] = (await list_calls(store, CallFilter(search="call-099995"), now)).calls
        assert (left_open.status, left_open.events, left_open.tool_calls) == ("stale", 2, 1)
        [taken] = (await list_calls(store, CallFilter(search="call-099990"), now)).calls
        assert (taken.status, taken.takeovers) == ("closed", 1)
    finally:
        await store.close()
    t = time.perf_counter()
    cli = await acli("calls", "--json", "--limit", "20", "--status", "closed", backend=migrated)
    timings["cli calls --status closed (whole process)"] = timed_s(t)
    assert cli.exit_code == 0 and len(json.loads(cli.stdout)["calls"]) == 20
    with running_viewer(migrated) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            for name, path in [("web list page", "/"), ("web list, closed", "/?status=closed"),
                               ("web list, search", "/?q=12345")]:
                t = time.perf_counter()
                r = await http.get(path)
                timings[name] = timed_s(t)
                assert r.status_code == 200 and timings[name] < BOUND_S, (name, timings)
            assert "100,000 calls match" in (await http.get("/")).text
    report(migrated, artifacts, "100k calls", timings)


async def test_a_50k_event_call_opens_fast(migrated, artifacts):
    await write_rows(migrated, *big_call())
    timings = {}
    with running_viewer(migrated) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for name, path in [("timeline page (first open)", "/calls/big"),
                               ("timeline page (again)", "/calls/big"),
                               ("timeline page, middle window", "/calls/big?from=25001"),
                               ("timeline page, last window", "/calls/big?from=49501")]:
                t = time.perf_counter()
                r = await http.get(path)
                timings[name] = timed_s(t)
                assert r.status_code == 200, r.text[:500]
                assert timings[name] < BOUND_S, (name, timings)
            assert "of 50,000" in r.text and r.text.count('<tr class="ev') >= 500
            t = time.perf_counter()
            st = (await http.get("/api/calls/big/state", params={"at": 50_000})).json()
            timings["state at 50000 (cold: folds 50k events)"] = timed_s(t)
            assert st["at"] == 50_000
            t = time.perf_counter()
            st = (await http.get("/api/calls/big/state", params={"at": 49_990})).json()
            timings["state at 49990 (from a cached checkpoint)"] = timed_s(t)
            assert st["at"] == 49_990 and st["state"]["calls_total"] > 5000
            assert timings["state at 49990 (from a cached checkpoint)"] < BOUND_S
            assert timings["state at 50000 (cold: folds 50k events)"] < 5 * BOUND_S
    t = time.perf_counter()
    r = await acli("timeline", "big", "--from", "25000", "--limit", "200", "--json",
                   backend=migrated)
    timings["cli timeline window of 200 (whole process)"] = timed_s(t)
    assert r.exit_code == 0 and len(json.loads(r.stdout)["entries"]) == 200
    report(migrated, artifacts, "50k-event call", timings)
