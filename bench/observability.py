"""What metrics and tracing cost a live call: turn latency with them on against off, same run.

The call of bench/turn_overhead.py (N turns, each a toolCall answered at once, between model
audio; the local Gemini Live server in a process of its own) through
DurableGeminiLiveLLMService on the default SQLite store, in interleaved rounds:

- `off`: nothing installed, pipecat not tracing: what the service costs today, with the
  hooks present and idle (a commit tests `observe.SINKS`, an append
  `observers.observer`, setup passes pipecat's tracing context, None, to tracing.follow);
- `metrics`: service.metrics.install() on a registry of its own, scraped (generate_latest)
  after every call, as Prometheus would;
- `traced`: pipecat's tracing on (enable_tracing, conversation_id) with the OpenTelemetry
  SDK and an in-memory exporter: pipecat's spans and the service's (service/tracing.py).

Printed: turn p50/p99 (toolCall sent by the server → toolResponse received) per variant and
each against `off` (target: metrics ≤ +0.2 ms p50); and, per commit, what the idle hooks
and the metrics sink cost in isolation (timeit), times the commits a turn makes: on a
loaded machine the turns' own noise (tens of ms) hides a cost this small, and this is the
figure that says what "no cost when off" and the metrics' cost are.

    python bench/observability.py            # 120 turns per variant, 6 interleaved rounds
    python bench/observability.py --quick    # CI: 15 turns, 3 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import timeit


from loguru import logger
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter)
from prometheus_client import CollectorRegistry, generate_latest

import turn_overhead
from callmix import pct
from service import metrics, observe
from service.driver import CallDriver
from session_store import Policy
from session_store import events as ev
from session_store.storage import observers

VARIANTS = ("off", "metrics", "traced")
#: (commits, turns) of each metrics-on call: what the sink's per-commit cost adds per turn.
COMMITS: list[tuple[float, int]] = []


async def one_call(variant: str, turns: int, store) -> list[float]:
    registry = None
    if variant == "metrics":
        registry = CollectorRegistry()
        metrics.install(registry)
    turn_overhead.WORKER_OPTIONS = {"enable_tracing": True} if variant == "traced" else {}
    try:
        result = await turn_overhead.run_call("ours", "overhead_script", turns, store=store,
                                              policy=Policy(defer="none"))
        if registry is not None:
            generate_latest(registry)  # a scrape, as Prometheus makes one
            COMMITS.append((registry.get_sample_value(
                "gemini_durable_commit_batch_events_count"), turns))
    finally:
        metrics.uninstall()
        turn_overhead.WORKER_OPTIONS = {}
    return turn_overhead.turn_latencies(result)


def per_commit_costs(store) -> dict[str, float]:
    """Microseconds per commit of: the idle hooks; the metrics sink and store observer on a
    turn's typical commit (a tool call's start with its request)."""
    driver = CallDriver(store, "bench-hooks")
    batch = [ev.ToolCallRequested("c1", "lookup_order", {"id": 1}, 1),
             ev.ToolCallStarted("c1", 1, "k", 1)]
    n = 200_000

    def idle() -> None:
        if observe.SINKS:
            observe.committed(driver, batch)
        if observers.observer is not None:
            observers.observer.committed(2)

    idle_us = timeit.timeit(idle, number=n) / n * 1e6
    installed = metrics.install(CollectorRegistry())
    try:
        on_us = timeit.timeit(lambda: (observe.committed(driver, batch),
                                       observers.observer.appended(0.001, None),
                                       observers.observer.committed(2)), number=n) / n * 1e6
    finally:
        metrics.uninstall()
    del installed
    return {"idle hooks": idle_us, "metrics": on_us}


async def main(turns: int, rounds: int) -> None:
    logger.remove()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)
    turn_ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
    round_p50: dict[str, list[float]] = {v: [] for v in VARIANTS}  # the noise: off vs off
    per_round = max(1, turns // rounds)
    with tempfile.TemporaryDirectory() as tmp:
        store, _ = await turn_overhead.open_backend("sqlite", tmp)
        try:
            await one_call("off", 2, store)  # warm-up, not measured
            gc.collect()
            gc.freeze()
            for _ in range(rounds):
                for variant in VARIANTS:
                    latencies = await one_call(variant, per_round, store)
                    turn_ms[variant] += latencies
                    round_p50[variant].append(pct(latencies, 50))
            costs = per_commit_costs(store)
        finally:
            await store.close()
    base = pct(turn_ms["off"], 50)
    print(f"\nObservability overhead, SQLite (default store), {turns} turns per variant, "
          f"{rounds} interleaved rounds")
    print(f"{'variant':10} {'turn p50 ms':>12} {'p99 ms':>8} {'p50 vs off':>11}")
    for variant in VARIANTS:
        p50, p99 = pct(turn_ms[variant], 50), pct(turn_ms[variant], 99)
        print(f"{variant:10} {p50:12.2f} {p99:8.2f} {p50 - base:+11.2f}")
    print("per commit, in isolation: " + ", ".join(f"{k} {v:.2f} us" for k, v in costs.items()))
    per_turn = sum(c for c, _ in COMMITS) / max(1, sum(t for _, t in COMMITS))
    sink_ms = per_turn * costs["metrics"] / 1000
    print(f"commits per turn (whole call, setup included) {per_turn:.1f}: the metrics sink "
          f"adds about {sink_ms:.3f} ms per turn, the idle hooks "
          f"{per_turn * costs['idle hooks'] / 1000:.4f} ms")
    added = pct(turn_ms["metrics"], 50) - base
    spread = max(round_p50["off"]) - min(round_p50["off"])
    print(f"metrics on: {added:+.2f} ms p50 end to end, where `off` alone moved by "
          f"{spread:.2f} ms between rounds; {sink_ms:.3f} ms per turn measured alone "
          f"(target <= +0.20 ms: {'met' if sink_ms <= 0.2 else 'NOT met'})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="15 turns, 3 rounds (CI)")
    args = parser.parse_args()
    if args.quick:
        args.turns, args.rounds = 15, 3
    asyncio.run(main(args.turns, args.rounds))
