"""The phone bot example as a fleet, end to end: 3 uvicorn worker processes on one database
(PostgreSQL in a private schema; SQLite for workers on one host), concurrent phone calls
through the Twilio stand-in, the local Gemini Live server, and a real SIGKILL of the worker
serving a call at a random point of one of its tool calls. Short form of `make demo-fleet`
(20 calls by hand); the verdict is examples/phone_bot/fleet.py's, from the log, the tool
ledger, the server's record and the callers' recordings."""

from __future__ import annotations

import random

import pytest

from examples.phone_bot.fleet import run_fleet

from . import fleet_metrics_checks

pytestmark = pytest.mark.timeout(240)

CALLS = 6


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_killed_workers_calls_go_on_on_the_others(db, tmp_path):
    seed = random.randrange(1 << 30)
    summary = await run_fleet(db, workers=3, calls=CALLS, seed=seed, workdir=tmp_path)
    where = f"seed {seed}, workdir {tmp_path}"
    assert not summary["violations"], "\n".join([where, *summary["violations"]])
    killed = summary["killed"]
    assert killed is not None and killed["calls_on_it"] >= 1, where
    affected = summary["affected"]
    assert killed["target"] in affected, where
    # Every call of the killed worker was heard again on a new stream, and taken over.
    assert len(summary["audio_gap_s"]["per_call"]) == len(affected), where
    assert len(summary["takeover_s"]["per_call"]) == len(affected), where
    assert summary["ok"], where
    # Each worker's /metrics, scraped over HTTP, against its log (fleet_metrics_checks.py).
    assert not (wrong := fleet_metrics_checks.problems(summary)), "\n".join([where, *wrong])
    print(f"\n{db}: killed at {killed['point']}; {len(affected)} of {CALLS} calls moved; "
          f"audio gap p50 {summary['audio_gap_s']['p50']} s, p99 {summary['audio_gap_s']['p99']} s; "
          f"takeover per call {summary['takeover_s']['per_call']} s")
