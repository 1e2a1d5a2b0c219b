"""Hostile call ids and filters: bound parameters only, a clean "not found", nothing else."""

from __future__ import annotations

import json
import random
import time

import pytest

from session_store.audit import CallFilter, parse_time
from session_store.audit.queries import (call_summary, count_calls, list_calls, overview,
                                         state_at)
from session_store.audit.verify import verify_log

from .helpers import acli, support_call, write_call

HOSTILE = ["'", '"', "'; DROP TABLE session_events; --", '"; DROP TABLE session_streams; --',
           "%", "_", "\\", "\\'", "🙂", "名前", "a\x00b", "../../etc/passwd",
           "<script>alert(1)</script>", " ", "x" * 300, "' OR '1'='1", "support-1' --",
           "support-%", "[bold]x[/]", "\u202egnp.exe", "NULL", "*", "\ud800x", "support-1\x00",
           "%' UNION SELECT stream_id, 1, 1, 1, 1 FROM session_streams --", "$1", ":s", "?"]
WEIRD_ID = "we'ird \"id\" [red]%_😀 --"


def generated(n: int = 40, seed: int = 20261130) -> list[str]:
    rng = random.Random(seed)
    alphabet = list("'\"%_\\;-*/()[]{}$?:=<> \t\n\x00") + ["😀", "名", "é", "\u202e", "\ud800",
                                                           "DROP", "SELECT", "OR", "1=1", "--"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(n)]


@pytest.fixture
async def weird(store, migrated):
    await write_call(migrated, "support-1", support_call())
    await write_call(migrated, WEIRD_ID, support_call()[:3])
    return store


async def test_queries_with_hostile_strings(weird):
    store, now = weird, time.time_ns() // 1000
    ids = ["support-1", WEIRD_ID]
    for s in HOSTILE + generated():
        if s in ids:
            continue
        assert await call_summary(store, s, now) is None
        assert await state_at(store, s) is None
        page = await list_calls(store, CallFilter(search=s), now)
        assert sorted(c.call_id for c in page.calls) == sorted(i for i in ids if s in i)
        assert await count_calls(store, CallFilter(search=s), now) == len(page.calls)
        with pytest.raises(ValueError, match="there is no call"):
            await list_calls(store, CallFilter(after=s, status="closed"), now)
        ov = await overview(store, s, 0, 1_000_000)
        assert not any(any(v) for v in ov.counts.values())
    # nothing was dropped or altered
    assert len(await store.read("support-1")) == 25
    assert all(r.ok for r in await verify_log(store))
    summary = await call_summary(store, WEIRD_ID, now)
    assert summary is not None and summary.events == 3
    assert (await state_at(store, WEIRD_ID)).version == 3


async def test_cli_with_hostile_strings(weird, migrated):
    for s in ["'; DROP TABLE session_events; --", "a\x00b", "[bold]x[/]", "%_\u202e😀 --"]:
        for command in ("state", "timeline", "export", "replay", "verify"):
            r = await acli(command, s, backend=migrated)
            assert r.exit_code == 2, (command, s, r.output)
            assert "not found" in r.stderr and "Traceback" not in r.output
        found = json.loads((await acli("calls", "--json", "--search", s,
                                       backend=migrated)).stdout)
        assert found["calls"] == []
        paged = await acli("calls", "--json", "--after", s, backend=migrated)
        assert paged.exit_code == 2 and "there is no call" in paged.stderr, paged.output
        bad = await acli("calls", "--since", s, backend=migrated)
        assert bad.exit_code == 2 and "not a time" in bad.stderr
    listed = json.loads((await acli("calls", "--json", backend=migrated)).stdout)
    assert {c["call"] for c in listed["calls"]} == {"support-1", WEIRD_ID}


async def test_a_call_with_a_hostile_id_round_trips(weird, migrated):
    table = await acli("calls", "--search", "[red]", backend=migrated)
    assert table.exit_code == 0 and "[red]" in table.stdout  # printed, not interpreted
    tl = json.loads((await acli("timeline", WEIRD_ID, "--json", backend=migrated)).stdout)
    assert tl["call"] == WEIRD_ID and len(tl["entries"]) == 3
    lines = (await acli("export", WEIRD_ID, backend=migrated)).stdout.splitlines()
    assert [json.loads(x)["call"] for x in lines] == [WEIRD_ID] * 3
    assert (await acli("verify", WEIRD_ID, backend=migrated)).exit_code == 0


OUT_OF_RANGE_TIMES = ["99999999999d", "100000000d", "999999999999999999999h",
                      "10000000000000000000000000s"]


async def test_a_time_out_of_range_is_bad_input_not_a_crash(weird, migrated):
    """An age too large for a date (a typo, a fuzzer) is bad input like any other that is not
    a time: one line and exit code 2 in the CLI, a 400 from the viewer (not a traceback
    with exit code 1, and a bare 500)."""
    from .conftest import running_viewer, viewer_client

    for text in OUT_OF_RANGE_TIMES:
        with pytest.raises(ValueError, match="not a time"):
            parse_time(text)
        for option in ("--since", "--until"):
            r = await acli("calls", option, text, backend=migrated)
            assert r.exit_code == 2 and "not a time" in r.stderr, (option, text, r.output)
    with running_viewer(migrated) as base:
        async with viewer_client(base) as http:
            for text in OUT_OF_RANGE_TIMES:
                for path in ("/", "/api/calls"):
                    r = await http.get(path, params={"since": text})
                    assert r.status_code == 400, (path, text, r.status_code)
