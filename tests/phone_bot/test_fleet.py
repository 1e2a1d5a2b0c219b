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
from rig.crash.harness import Databases
from session_store import open_store
from session_store.heard import CUT_MARK

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


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_greeting_cut_by_a_kill_is_finished_by_the_next_worker(db, tmp_path):
    """SIGKILLed right after the greeting's message is logged (its handle with it), the audio
    just started: the caller heard a fraction of it. The next worker cuts the message to what
    the caller can have heard (TakenOver), so it seeds a fresh session instead of resuming
    the handle that holds the whole greeting, and the model goes on from the cut: the caller
    hears the rest of the greeting, once. (Before: resumed, the greeting was never heard
    whole, and the model went on to the refund nobody had asked for yet.)"""
    seed = random.randrange(1 << 30)
    summary = await run_fleet(db, workers=2, calls=2, seed=seed, workdir=tmp_path, keep=True,
                              kill_step="greeting-playing", kill_delay_s=0.0)
    where = f"seed {seed}, workdir {tmp_path}"
    assert summary["ok"], where
    target = summary["killed"]["target"]
    heard = summary["heard"]
    assert heard["repeats"] == 0, where
    runs = heard["per_call"][target]
    assert [stream for name, stream, _s in runs if name == "greeting"] == [0, 1], (where, runs)
    store = await open_store(summary["db_url"], **({"schema": summary["db_schema"]}
                                                    if summary["db_schema"] else {}))
    try:
        records = await store.read(target)
    finally:
        await store.close()
        if summary["db_schema"]:  # (kept by the run: dropped here)
            databases = Databases(db, tmp_path)
            databases.schemas.append(summary["db_schema"])
            await databases.cleanup()
    types = [r.type for r in records]
    attached = types.index("session.worker_attached")
    cut = records[attached + 2]
    assert types[attached + 1:attached + 3] == ["decision.observed", "conversation.message_cut"]
    assert cut.data["text"].endswith(CUT_MARK), cut.data
    taken = records[attached + 1].data
    assert taken["kind"] == "TakenOver", taken
    handed_over = taken["data"]["handed_over_us"]  # the redirect's stream token, issued
    assert records[attached - 1].recorded_at_us < handed_over < records[attached].recorded_at_us
    # The cut counts what the dead worker can have written by the hand-over (the stream
    # token's time, not the later takeover): real time since the greeting's first audio
    # plus the pacing's lead. The caller heard at most that on the old stream, and the rest
    # after the cut on the new one. What they never heard is only what the dead worker had
    # not yet written when its last event was logged (a worker behind real time, as on a
    # loaded machine): on an idle one, nothing.
    greeting = next(r for r in records[:attached] if r.type == "conversation.message"
                    and r.data["role"] == "assistant")
    lead = taken["data"]["playback_lead_s"]
    cut_s = min(greeting.data["audio_s"],
                (handed_over - greeting.data["audio_from_us"]) / 1e6 + lead)
    old_part, new_part = ([secs for name, stream, secs in runs
                           if name == "greeting" and stream == n] for n in (0, 1))
    chunk = 0.04  # (the stand-in's audio comes in 40 ms chunks)
    assert sum(old_part) <= cut_s + chunk, (where, runs, cut_s)
    assert abs(sum(new_part) - (greeting.data["audio_s"] - cut_s)) <= 2 * chunk, \
        (where, runs, cut_s)
    unwritten_s = (handed_over - records[attached - 1].recorded_at_us) / 1e6 + lead
    assert cut_s - sum(old_part) <= unwritten_s + chunk, (where, runs, cut_s, unwritten_s)
    # Seeded afresh with the cut greeting: the session after the takeover resumed no handle.
    connected = next(r for r in records[attached:] if r.type == "connection.connected")
    assert connected.data["handle"] is None, connected.data
