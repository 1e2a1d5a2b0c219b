"""The fleet's /metrics, scraped from every worker, and what each worker's log says they
should read (fleet.py stores both in its summary; tests/phone_bot/test_fleet.py compares).

The expectation is read from the log, not from the metrics' code path: every event is
credited to the worker that owned its call then (the last session.opened or
session.worker_attached before it), found by the pid in its worker id.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
from prometheus_client.parser import text_string_to_metric_families

from session_store import open_store

#: The counters whose value a worker's log fixes exactly: (metric, labels) as
#: prometheus_client's parser gives them (`_total` samples).
FROM_LOG = (
    "calls_started_total", "calls_taken_over_total", "calls_ended_total{reason=ended}",
    "tool_calls_deferred_total", "tool_calls_run_total", "tool_calls_rerun_total",
    "tool_calls_unknown_outcome_total", "results_resent_total",
    "prompt_changes_total{how=reconnect}", "prompt_changes_total{how=context_update}",
    "handshake_failures_total", "connections_given_up_total", "commit_batch_events_sum")


def samples(text: str) -> dict[str, float]:
    """A scrape as {"name{label=value,...}": value}, names without the gemini_durable_
    prefix; only the service's metrics."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("gemini_durable_"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[s.name.removeprefix("gemini_durable_") + (f"{{{labels}}}" if labels
                                                               else "")] = s.value
    return out


async def scrape(http: httpx.AsyncClient, url: str) -> str:
    response = await http.get(f"{url}/metrics")
    response.raise_for_status()
    return response.text


async def scrape_settled(http: httpx.AsyncClient, url: str, timeout_s: float = 15.0) -> str:
    """A scrape once the worker serves no call (a hung-up call's pipeline ends a little after
    the caller's side), or the last one after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = await scrape(http, url)
        if samples(text).get("live_calls") == 0 or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.2)


async def expected_from_log(store, pids: list[int]) -> dict[int, dict[str, float]]:
    """Per worker pid, the value each FROM_LOG counter should have, from every call's log."""
    counts = {pid: Counter() for pid in pids}
    records, position = [], 0
    while page := await store.read_all(position, 1000):
        records += page
        position = page[-1].position
    owner: dict[str, int | None] = {}
    sends: dict[tuple[str, str, int], list[int]] = {}
    for r in sorted(records, key=lambda r: (r.stream_id, r.version)):
        data = r.data
        if r.type in ("session.opened", "session.worker_attached"):
            owner[r.stream_id] = int(data["worker"].split(":")[1])
        c = counts.get(owner.get(r.stream_id))
        if c is None:
            continue  # the killed worker's, or a writer outside the fleet
        c["commit_batch_events_sum"] += 1
        match r.type:
            case "session.opened":
                c["calls_started_total"] += 1
            case "session.worker_attached" if data.get("reason") == "takeover":
                c["calls_taken_over_total"] += 1
            case "session.closed":
                c["calls_ended_total{reason=ended}"] += 1
            case "tool.call_deferred":
                c["tool_calls_deferred_total"] += 1
            case "tool.call_started":
                c["tool_calls_run_total" if data["attempt"] <= 1 else "tool_calls_rerun_total"] += 1
            case "tool.call_failed" if data.get("outcome_unknown"):
                c["tool_calls_unknown_outcome_total"] += 1
            case "tool.result_sending":
                earlier = sends.setdefault((r.stream_id, data["call_id"], data.get("part", 0)), [])
                if any(g < data["generation"] for g in earlier):
                    c["results_resent_total"] += 1
                earlier.append(data["generation"])
            case "connection.reconnect_requested" if data.get("reason") == "settings":
                c["prompt_changes_total{how=reconnect}"] += 1
            case "settings.context_sent":
                c["prompt_changes_total{how=context_update}"] += 1
            case "anomaly.recorded" if data.get("kind") == "handshake_failed":
                c["handshake_failures_total"] += 1
            case "anomaly.recorded" if data.get("kind") == "connection_given_up":
                c["connections_given_up_total"] += 1
    return {pid: {name: float(c[name]) for name in FROM_LOG} for pid, c in counts.items()}


async def scrape_all(workers) -> dict[int, dict[str, float]]:
    """Every running worker's metrics now (fleet.py's Worker: index, url, process)."""
    async with httpx.AsyncClient(timeout=5) as http:
        return {w.index: samples(await scrape(http, w.url)) for w in workers
                if w.process.returncode is None}


async def collect(workers, before: dict[int, dict[str, float]], url: str,
                  schema: str | None) -> dict:
    """After the calls: per worker, its metrics before and after (None: it was killed) and
    what its log says they should read."""
    store = await open_store(url, **({"schema": schema} if schema else {}))
    try:
        expected = await expected_from_log(store, [w.pid for w in workers])
    finally:
        await store.close()
    async with httpx.AsyncClient(timeout=5) as http:
        after = {w.index: samples(await scrape_settled(http, w.url)) for w in workers
                 if w.process.returncode is None}
    return {w.index: {"pid": w.pid, "before": before.get(w.index), "after": after.get(w.index),
                      "expected": expected[w.pid]} for w in workers}
