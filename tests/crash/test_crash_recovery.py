"""Crash recovery end to end: real worker processes, real SIGKILLs, a new worker resumes.

Every boundary: for every scenario, the first worker dies right after each event it appends
and inside each tool between its side effect and the append of its outcome; a new worker
takes the call over from the log; I1–I7 are checked against the local Gemini Live server's
record, the tools' side-effect ledger and the log. Then a short random soak (external
SIGKILLs at random times). Both databases. The long soak runs by hand:
`python -m service.crash.harness --mode soak --kills 1000 --db postgres`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from service.crash.harness import Databases, run_boundaries, run_soak, summarise
from service.crash.scenarios import SCENARIOS, SCRIPTED, ServerPlan, known_results
from service.local_live import LocalLiveServer

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(params=["sqlite", "postgres"])
async def databases(request, tmp_path):
    dbs = Databases(request.param, tmp_path)
    yield dbs
    await dbs.cleanup()


async def test_every_boundary_of_every_scenario(databases, tmp_path):
    results = await run_boundaries(sorted(SCRIPTED), databases, tmp_path, parallel=3)
    summary = summarise(results)
    print(json.dumps(summary, indent=2))
    assert summary["kills"] >= len(results) - len(SCRIPTED), "most cases must really kill"
    assert summary["violations"] == []


async def test_random_soak(databases, tmp_path):
    results = await run_soak(sorted(SCRIPTED), 8, databases, tmp_path, parallel=3, seed=7)
    summary = summarise(results)
    print(json.dumps(summary, indent=2))
    assert summary["violations"] == []


def test_demo_runs_offline_and_reports_a_verdict(tmp_path):
    db = f"sqlite+aiosqlite:///{tmp_path / 'demo.db'}"
    out = subprocess.run([sys.executable, "-m", "session_store.cli", "demo", "--db", db,
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    verdict = json.loads(out.stdout[out.stdout.index("{"):])
    assert verdict["ok"] is True and verdict["violations"] == []
    assert verdict["kills"] == 1 and verdict["events"] > 20


def test_live_demo_refuses_without_a_key(tmp_path):
    db = f"sqlite+aiosqlite:///{tmp_path / 'demo.db'}"
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_API_KEY"}
    out = subprocess.run([sys.executable, "-m", "session_store.cli", "demo", "--live", "--db", db],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "GOOGLE_API_KEY" in out.stderr


async def test_live_demo_path_against_a_protocol_compatible_endpoint(tmp_path):
    """`demo --live` is the same call against the real API, which CI cannot reach: here its
    live code path (key from the environment, the model choosing the calls, completion by
    `live_complete`, checks without a server record) talks to the local server instead,
    playing the live scenario. The key never reaches the log."""
    key = "AIzaLIVE-DEMO-TEST-KEY-must-never-be-logged"
    plan = ServerPlan(SCENARIOS["live"])
    async with LocalLiveServer(plan.script) as server:
        db = f"sqlite+aiosqlite:///{tmp_path / 'live.db'}"
        cmd = [sys.executable, "-m", "session_store.cli", "demo", "--live", "--json",
               "--db", db, "--base-url", server.base_url, "--ca-cert", str(server.cert_path)]
        out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True,
                                      timeout=300, env={**os.environ, "GOOGLE_API_KEY": key})
        assert out.returncode == 0, out.stderr[-3000:]
        verdict = json.loads(out.stdout[out.stdout.index("{"):])
        assert verdict["ok"] is True and verdict["live"] is True and verdict["kills"] == 1
        # The model saw both calls answered once, and the new prompt, on the wire.
        assert not [v for v in server.violations if v["kind"] != "wait_timeout"]
        assert {"lookup_order", "refund_order"} <= known_results(server.connections[-1])
        assert server.connections[-1].system_instruction == SCENARIOS["live"].new_prompt
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("live.db*"))
    assert stored and key.encode() not in stored
