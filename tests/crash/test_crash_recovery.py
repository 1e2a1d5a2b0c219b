"""Crash recovery end to end: real worker processes, real SIGKILLs, a new worker resumes.

Every boundary: for every scenario, the first worker dies right after each event it appends
and inside each tool between its side effect and the append of its outcome; a new worker
takes the call over from the log; I1–I7 are checked against the local Gemini Live server's
record, the tools' side-effect ledger and the log. Then a short random soak (external
SIGKILLs at random times). Both databases. The long soak runs by hand:
`python -m service.crash.harness --mode soak --kills 1000 --db postgres`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from service.crash.harness import Databases, run_boundaries, run_soak, summarise
from service.crash.scenarios import SCENARIOS

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(params=["sqlite", "postgres"])
async def databases(request, tmp_path):
    dbs = Databases(request.param, tmp_path)
    yield dbs
    await dbs.cleanup()


async def test_every_boundary_of_every_scenario(databases, tmp_path):
    results = await run_boundaries(sorted(SCENARIOS), databases, tmp_path, parallel=3)
    summary = summarise(results)
    print(json.dumps(summary, indent=2))
    assert summary["kills"] >= len(results) - len(SCENARIOS), "most cases must really kill"
    assert summary["violations"] == []


async def test_random_soak(databases, tmp_path):
    results = await run_soak(sorted(SCENARIOS), 8, databases, tmp_path, parallel=3, seed=7)
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
