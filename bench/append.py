"""Append throughput: our store against the raw driver, in the same run.

For 1, 16 and 256 concurrent sessions, on SQLite and PostgreSQL, the same ~200-byte events
are appended (a) with the raw driver, one event per transaction at the same durability
(sqlite3 WAL synchronous=FULL, one connection per session thread; asyncpg with one pooled
connection per session, at most 32), and (b) through the store, one append per event. Prints
events/s, p50/p99 latency of one append, the ratio ours/raw, and how late a 5 ms ticker task on
the event loop woke (`lag`, raw → ours: what the store costs everything else on the loop, e.g.
the audio of calls; asyncio's timers alone are up to ~1 ms late, see the raw figure).
`sqlite-inline` is the store with inline commits switched on (`inline_budget`), one session.

The ratio is a same-run comparison, not a target: the raw driver commits on the thread that
calls it (a loop would block on every fsync), ours keeps fsyncs off the event loop that
carries a call's audio. What a caller feels is measured by turn_overhead.py (added latency per
tool call beyond the raw commit floor, nothing on the audio path) and concurrent_calls.py.

    python bench/append.py              # full run (a few minutes)
    python bench/append.py --quick      # CI smoke run: fewer events
    python bench/append.py --rounds 5   # repeat each configuration, print ratio ranges
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid

import asyncpg

from session_store import open_store
from session_store.events import ConversationMessage, canonical_json
from session_store.storage.migrate import upgrade

PG_URL = os.environ.get("SESSION_STORE_BENCH_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PG_DSN = PG_URL.replace("postgresql+asyncpg", "postgresql")
TEXT = "The order 48213 shipped on Tuesday and should arrive by Friday, tracking 1Z999." * 2
EVENT = ConversationMessage("assistant", TEXT[:150], 1)
PAYLOAD = canonical_json(EVENT.to_data())
RAW_TABLE = """CREATE TABLE raw_events (position {pk}, stream_id TEXT NOT NULL,
    version BIGINT NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL,
    recorded_at_us BIGINT NOT NULL, UNIQUE (stream_id, version))"""


def percentiles(latencies: list[float]) -> tuple[float, float]:
    qs = statistics.quantiles(latencies, n=100, method="inclusive")
    return qs[49] * 1e3, qs[98] * 1e3


class LagProbe:
    """A task that sleeps 5 ms over and over and records how late it wakes."""

    PERIOD = 0.005

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.PERIOD
            await asyncio.sleep(self.PERIOD)
            self.lags.append(max(loop.time() - due, 0.0))

    def __enter__(self) -> "LagProbe":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc) -> None:
        self._task.cancel()

    def p99_max_ms(self) -> tuple[float, float]:
        if len(self.lags) < 2:
            return 0.0, max(self.lags, default=0.0) * 1e3
        return percentiles(self.lags)[1], max(self.lags) * 1e3


# ------------------------------------------------------------------ raw drivers

def raw_sqlite(path: str, sessions: int, per_session: int) -> tuple[float, list[float]]:
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute(RAW_TABLE.format(pk="INTEGER PRIMARY KEY"))
    setup.close()
    latencies: list[float] = []
    lock = threading.Lock()

    def session(n: int) -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=60)
        conn.execute("PRAGMA synchronous=FULL")
        mine = []
        for v in range(1, per_session + 1):
            t = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO raw_events (stream_id, version, type, data, recorded_at_us)"
                         " VALUES (?, ?, ?, ?, ?)", (f"s{n}", v, EVENT.TYPE, PAYLOAD,
                                                     time.time_ns() // 1000))
            conn.execute("COMMIT")
            mine.append(time.perf_counter() - t)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=session, args=(n,)) for n in range(sessions)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - start, latencies


async def raw_asyncpg(schema: str, sessions: int, per_session: int) -> tuple[float, list[float]]:
    settings = {"search_path": schema, "synchronous_commit": "on"}
    pool = await asyncpg.create_pool(PG_DSN, min_size=min(sessions, 32), max_size=min(sessions, 32),
                                     server_settings=settings)
    async with pool.acquire() as conn:
        await conn.execute(RAW_TABLE.format(pk="BIGSERIAL PRIMARY KEY"))
    latencies: list[float] = []

    async def session(n: int) -> None:
        for v in range(1, per_session + 1):
            t = time.perf_counter()
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO raw_events (stream_id, version, type, data, recorded_at_us) "
                    "VALUES ($1, $2, $3, $4, $5)", f"s{n}", v, EVENT.TYPE, PAYLOAD,
                    time.time_ns() // 1000)
            latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(session(n) for n in range(sessions)))
    elapsed = time.perf_counter() - start
    await pool.close()
    return elapsed, latencies


# ------------------------------------------------------------------ ours

async def ours(url: str, options: dict, sessions: int, per_session: int
               ) -> tuple[float, list[float], dict, LagProbe]:
    store = await open_store(url, **options)
    latencies: list[float] = []
    probe = LagProbe()

    async def session(n: int) -> None:
        version = 0
        for _ in range(per_session):
            t = time.perf_counter()
            version = await store.append(f"s{n}", [EVENT], version)
            latencies.append(time.perf_counter() - t)

    with probe:
        start = time.perf_counter()
        await asyncio.gather(*(session(n) for n in range(sessions)))
        elapsed = time.perf_counter() - start
    stats = dict(store.stats)
    await store.close()
    return elapsed, latencies, stats, probe


# ------------------------------------------------------------------ driver

async def pg_schema() -> str:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_DSN)
    await conn.execute(f"CREATE SCHEMA {name}")
    await conn.close()
    return name


async def drop_schema(name: str) -> None:
    conn = await asyncpg.connect(PG_DSN)
    await conn.execute(f"DROP SCHEMA {name} CASCADE")
    await conn.close()


async def run_one(backend: str, sessions: int, total: int, store_options: dict) -> dict:
    per_session = max(total // sessions, 2)
    n = per_session * sessions
    raw_probe = LagProbe()
    with tempfile.TemporaryDirectory() as tmp:
        if backend.startswith("sqlite"):
            with raw_probe:
                raw_t, raw_lat = await asyncio.to_thread(raw_sqlite, f"{tmp}/raw.db", sessions,
                                                         per_session)
            # sqlite-inline: the opt-in inline commits (see sqlite/dialect.py), which apply
            # to a store serving one stream only.
            url = f"sqlite+aiosqlite:///{tmp}/ours.db"
            options = {"inline": "always"} if backend == "sqlite-inline" else {}
            options.update(store_options)
            await upgrade(url)
            our_t, our_lat, stats, probe = await ours(url, options, sessions, per_session)
        else:
            raw_schema, our_schema = await pg_schema(), await pg_schema()
            try:
                with raw_probe:
                    raw_t, raw_lat = await raw_asyncpg(raw_schema, sessions, per_session)
                await upgrade(PG_URL, schema=our_schema)
                our_t, our_lat, stats, probe = await ours(
                    PG_URL, {"schema": our_schema, **store_options}, sessions, per_session)
            finally:
                await drop_schema(raw_schema)
                await drop_schema(our_schema)
    raw_p50, raw_p99 = percentiles(raw_lat)
    our_p50, our_p99 = percentiles(our_lat)
    lag_p99, lag_max = probe.p99_max_ms()
    raw_lag_p99, _ = raw_probe.p99_max_ms()
    return {"backend": backend, "sessions": sessions, "events": n,
            "raw_eps": n / raw_t, "ours_eps": n / our_t, "ratio": raw_t / our_t,
            "raw_p50_ms": raw_p50, "raw_p99_ms": raw_p99,
            "ours_p50_ms": our_p50, "ours_p99_ms": our_p99,
            "lag_p99_ms": lag_p99, "lag_max_ms": lag_max, "raw_lag_p99_ms": raw_lag_p99,
            "events_per_commit": stats["events"] / max(stats["batches"], 1),
            "inline_share": stats.get("inline", 0) / max(stats["batches"], 1)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run for CI")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every configuration this many times (raw and ours each "
                             "time), then print the range of ratios")
    parser.add_argument("--sessions", type=int, nargs="+", help="only these session counts")
    parser.add_argument("--writers", type=int, help="the store's group-commit writer tasks "
                        "(default: the dialect's own, SQLite 1, PostgreSQL 2)")
    args = parser.parse_args()
    totals = {1: 300, 16: 1600, 256: 2560} if args.quick else {1: 2000, 16: 8000, 256: 12800}
    if args.sessions:
        totals = {k: v for k, v in totals.items() if k in args.sessions}
    backends = {"sqlite": ["sqlite", "sqlite-inline"], "postgres": ["postgres"],
                "both": ["sqlite", "sqlite-inline", "postgres"]}[args.backend]
    rows = []
    header = (f"{'backend':13} {'sessions':>8} {'raw ev/s':>9} {'ours ev/s':>9} {'ours/raw':>8} "
              f"{'raw p50/p99 ms':>15} {'ours p50/p99 ms':>16} {'ev/commit':>9} "
              f"{'lag p99 raw→ours/max ms':>23}")
    if not args.json:
        print(header)
    for _ in range(args.rounds):
        for backend in backends:
            for sessions, total in totals.items():
                if backend == "sqlite-inline" and sessions > 1:
                    continue  # several streams: the store never commits inline
                row = await run_one(backend, sessions, total,
                                    {"writers": args.writers} if args.writers else {})
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print(f"{backend:13} {sessions:>8} {row['raw_eps']:>9.0f} "
                          f"{row['ours_eps']:>9.0f} {row['ratio']:>7.2f}x "
                          f"{row['raw_p50_ms']:>7.2f}/{row['raw_p99_ms']:<7.2f} "
                          f"{row['ours_p50_ms']:>8.2f}/{row['ours_p99_ms']:<7.2f} "
                          f"{row['events_per_commit']:>9.1f} "
                          f"{row['raw_lag_p99_ms']:>7.2f} → {row['lag_p99_ms']:>5.2f}/"
                          f"{row['lag_max_ms']:<7.2f}", flush=True)
    if args.rounds > 1 and not args.json:
        print(f"\n{'backend':13} {'sessions':>8}  ours/raw over {args.rounds} rounds: "
              "min / median / max")
        for backend in backends:
            for sessions in totals:
                ratios = sorted(r["ratio"] for r in rows
                                if r["backend"] == backend and r["sessions"] == sessions)
                if not ratios:
                    continue
                print(f"{backend:13} {sessions:>8}  {ratios[0]:.2f}x / "
                      f"{statistics.median(ratios):.2f}x / {ratios[-1]:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
