"""Recovery: time to load and project one call's log, against the raw driver, same run.

For calls of 100 / 2,000 / 50,000 events (the scripted mix of bench/callmix.py), on SQLite
and PostgreSQL, measures (median of repeated runs, warm connections, nothing cached in the
process):

- raw: the raw driver (aiosqlite / asyncpg) reads the same rows of the call and json-decodes
  every payload — the floor of any loader;
- read: `store.read(call)` alone (rows to RecordedEvent);
- load: `load_state(store, call, use_snapshot=False)`: read + decode + fold;
- snap: `load_state(store, call)` with a snapshot saved at the end minus a tail of 20 events:
  load the (compacted) snapshot, read and fold the tail; and its part parsing the snapshot
  (`from_snapshot`). The call is written as it would be: each append stamped with its time
  in the scripted call (a 50,000-event call lasts about 7 hours), so calls answered long ago
  are settled for good and compaction leaves them out of the snapshot.

Targets (issue 6): <= 50 ms at 2,000 events; flat beyond with snapshots.

    python bench/recovery.py            # 100 / 2,000 / 50,000 events
    python bench/recovery.py --quick    # CI: 100 / 2,000 / 10,000 events, fewer repeats
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time


import aiosqlite
import asyncpg

from callmix import (PG_DSN, PG_URL, drop_schema, machine, median_ms, pg_reachable,
                     pg_schema, scripted_steps)
from session_store import Policy, choose_resumption, due, load_state, open_store
from session_store import save_snapshot
from session_store.projection import from_snapshot
from session_store.storage.migrate import upgrade
from session_store.delivery import unanswered, undelivered

TAIL = 20
CHUNK = 100  # events per append while building a call (stamped with its last step's time)
T0_US = 1_767_225_600_000_000  # the call starts at 2026-01-01 00:00 UTC
SELECT = ("SELECT version, type, schema_version, data, recorded_at_us FROM session_events "
          "WHERE stream_id = {} ORDER BY version")


def timed_sync(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


async def build_call(store, stream: str, n: int) -> None:
    version, chunk, at = 0, [], 0.0
    for at, step in scripted_steps(n, stream):
        chunk += step
        if len(chunk) >= CHUNK:
            version = await store.append(stream, chunk, version,
                                         recorded_at_us=T0_US + int(at * 1e6))
            chunk = []
    if chunk:
        await store.append(stream, chunk, version, recorded_at_us=T0_US + int(at * 1e6))
    state = await load_state(store, stream, use_snapshot=False, to_version=n - TAIL)
    await save_snapshot(store, state)


def decisions(state) -> tuple:
    """What the service decides from a state (the snapshot path must decide the same)."""
    policy, now = Policy(), state.last_event_at_us
    return (state.version, [c.call_id for c in unanswered(state)],
            [c.call_id for c in undelivered(state)], due(state, policy, now),
            choose_resumption(state, policy, now), state.bot_speaking, state.generation)


class RawReader:
    """The raw driver, one warm connection, reading the rows the store wrote."""

    def __init__(self, backend: str, target: str):
        self.backend, self.target, self.conn = backend, target, None

    async def open(self):
        if self.backend == "sqlite":
            self.conn = await aiosqlite.connect(self.target)
        else:
            self.conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": self.target})
        return self

    async def read(self, stream: str) -> list:
        if self.backend == "sqlite":
            async with self.conn.execute(SELECT.format("?"), (stream,)) as cur:
                rows = await cur.fetchall()
        else:
            rows = await self.conn.fetch(SELECT.format("$1"), stream)
        return [(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in rows]

    async def close(self):
        await self.conn.close()


async def measure(store, raw: RawReader, n: int, repeats: int) -> dict:
    stream = f"call-{n}"
    t = time.perf_counter()
    await build_call(store, stream, n)
    build_s = time.perf_counter() - t
    # Correctness first: the snapshot path decides as the full fold does.
    full, fast = (await load_state(store, stream, use_snapshot=False),
                  await load_state(store, stream))
    assert full.version == fast.version == n and decisions(full) == decisions(fast)
    assert len(await raw.read(stream)) == n
    snap = await store.load_snapshot(stream)
    row = {
        "events": n,
        "raw_ms": await median_ms(lambda: raw.read(stream), repeats),
        "read_ms": await median_ms(lambda: store.read(stream), repeats),
        "load_ms": await median_ms(lambda: load_state(store, stream, use_snapshot=False), repeats),
        "snap_ms": await median_ms(lambda: load_state(store, stream), repeats),
        "parse_snapshot_ms": timed_sync(lambda: from_snapshot(snap.state_json), repeats),
        "hot_calls": len(fast.calls),
        "snapshot_kb": round(len(snap.state_json) / 1024, 1),
        "tool_calls": len(full.calls), "build_s": round(build_s, 2),
    }
    for k in ("raw_ms", "read_ms", "load_ms", "snap_ms", "parse_snapshot_ms"):
        row[k] = round(row[k], 2)
    row["load_over_raw"] = round(row["load_ms"] / row["raw_ms"], 2)
    return row


async def run_backend(backend: str, sizes: list[int], repeats: dict[int, int]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        schema = None
        if backend == "sqlite":
            url, options, target = f"sqlite+aiosqlite:///{tmp}/ours.db", {}, f"{tmp}/ours.db"
            await upgrade(url)
        else:
            schema = await pg_schema()
            url, options, target = PG_URL, {"schema": schema}, schema
            await upgrade(url, schema=schema)
        store = await open_store(url, **options)
        raw = await RawReader(backend, target).open()
        try:
            await build_call(store, "warm-up", 50)  # open pooled connections first
            await load_state(store, "warm-up")
            rows = []
            for n in sizes:
                row = {"backend": backend, **await measure(store, raw, n, repeats[n])}
                print_row(row)
                rows.append(row)
            return rows
        finally:
            await raw.close()
            await store.close()
            if schema:
                await drop_schema(schema)


def print_row(r: dict) -> None:
    print(f"{r['backend']:8} {r['events']:>6} {r['raw_ms']:>8.2f} {r['read_ms']:>8.2f} "
          f"{r['load_ms']:>8.2f} {r['load_over_raw']:>6.2f}x {r['snap_ms']:>8.2f} "
          f"{r['parse_snapshot_ms']:>8.2f} {r['snapshot_kb']:>8.1f} "
          f"{r['tool_calls']:>6} {r['hot_calls']:>5}", flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller calls, fewer repeats (CI)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    sizes = [100, 2000, 10000] if args.quick else [100, 2000, 50000]
    repeats = dict(zip(sizes, (20, 10, 3) if args.quick else (50, 20, 5)))
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    if "postgres" in backends and not await pg_reachable():
        print(f"PostgreSQL not reachable at {PG_DSN}: skipping it")
        backends.remove("postgres")
    print(f"{machine()}; median ms; snapshot at the end minus {TAIL} events; raw = driver "
          "read + json.loads")
    print(f"{'backend':8} {'events':>6} {'raw':>8} {'read':>8} {'load':>8} {'ld/raw':>7} "
          f"{'snap':>8} {'parse':>8} {'snap KB':>8} {'tools':>6} {'hot':>5}")
    rows = []
    for backend in backends:
        rows += await run_backend(backend, sizes, repeats)
    print(f"after: {machine()}")
    verdicts = {}
    for backend in backends:
        mine = {r["events"]: r for r in rows if r["backend"] == backend}
        small, big = mine[2000], mine[max(sizes)]
        verdicts[backend] = {
            "load_2000_ms": small["load_ms"], "snap_2000_ms": small["snap_ms"],
            "le_50ms_at_2000": small["load_ms"] <= 50.0,
            "snap_growth_2000_to_max": round(big["snap_ms"] / small["snap_ms"], 2),
            "flat_with_snapshots": big["snap_ms"] <= 2 * small["snap_ms"]}
        v = verdicts[backend]
        print(f"target {backend}: load at 2,000 = {v['load_2000_ms']:.1f} ms (<= 50 ms: "
              f"{'MET' if v['le_50ms_at_2000'] else 'NOT MET'}); with snapshots "
              f"{max(sizes):,} vs 2,000 events = {v['snap_growth_2000_to_max']}x "
              f"(flat, <= 2x: {'MET' if v['flat_with_snapshots'] else 'NOT MET'})")
    print(json.dumps({"bench": "recovery", "quick": args.quick, "tail": TAIL, "rows": rows,
                      "targets": verdicts}))


if __name__ == "__main__":
    asyncio.run(main())
