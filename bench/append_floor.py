"""Where one append's time goes (one session), step by step against the raw driver.

bench/append.py runs the raw driver, then our store: on a shared machine the disk's speed can
change between the two. Here every step runs in small blocks, all steps in turn, over several
rounds, in one process, so they see the same machine; medians per event are printed with
raw/step (the throughput ratio ours/raw that step alone allows).

SQLite (WAL, synchronous=FULL, one event per transaction):
  raw          BEGIN IMMEDIATE; INSERT; COMMIT               (bench/append.py's raw driver)
  our table    the same into our events table (hash column, (stream, version) index)
  + head row   and a conditional UPDATE of the stream's head row: the least our log writes
  ours         store.append, committed inline (encode, hash chain, plan, asyncio, all of it)
  ours/writer  store.append through the writer process (the default store)
PostgreSQL (synchronous_commit=on):
  raw          asyncpg pool of 1, BEGIN; INSERT; COMMIT       (bench/append.py's raw driver)
  raw 1 trip   one INSERT in its own implicit transaction (the floor for a durable write)
  ours         store.append (one function call: one round trip)

    python bench/append_floor.py [--rounds 10] [--block 200] [--backend sqlite|postgres|both]
    python bench/append_floor.py --quick    # CI: 3 rounds of 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time

import asyncpg


from append import (EVENT, PAYLOAD, PG_DSN, PG_URL, RAW_TABLE, drop_schema,
                    pg_schema)

from session_store import open_store
from session_store.events import canonical_json
from session_store.storage.migrate import upgrade

_RAW_INSERT = ("INSERT INTO raw_events (stream_id, version, type, data, recorded_at_us) "
               "VALUES (?, ?, ?, ?, ?)")
_OUR_INSERT = ("INSERT INTO session_events (tx_order, stream_id, version, type, schema_version, "
               "data, recorded_at_us, hash) VALUES (0, ?, ?, ?, ?, ?, ?, ?)")
_HEAD_UPDATE = ("UPDATE session_streams SET version = ?, last_hash = ?, updated_at_us = ? "
                "WHERE stream_id = ? AND version = ? AND last_hash = ? AND epoch = 0")
_HASH = "ab" * 32


def _sqlite_conn(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


async def sqlite_steps(tmp: str):
    raw = _sqlite_conn(f"{tmp}/raw.db")
    raw.execute(RAW_TABLE.format(pk="INTEGER PRIMARY KEY"))
    tables = {}
    for name in ("table", "head", "ours", "thread"):
        await upgrade(f"sqlite+aiosqlite:///{tmp}/{name}.db")
        if name in ("table", "head"):
            tables[name] = _sqlite_conn(f"{tmp}/{name}.db")
    tables["head"].execute("INSERT INTO session_streams VALUES ('s', 0, '', 0, 0, 0)")
    ours = await open_store(f"sqlite+aiosqlite:///{tmp}/ours.db", inline="always",
                            inline_budget=60.0)
    thread = await open_store(f"sqlite+aiosqlite:///{tmp}/thread.db", inline="never")
    v = {"raw": 0, "table": 0, "head": 0, "ours": 0, "thread": 0}

    def raw_one():
        v["raw"] += 1
        raw.execute("BEGIN IMMEDIATE")
        raw.execute(_RAW_INSERT, ("s", v["raw"], EVENT.TYPE, PAYLOAD, time.time_ns() // 1000))
        raw.execute("COMMIT")

    def table_one():
        c, n = tables["table"], v["table"] + 1
        v["table"] = n
        c.execute("BEGIN IMMEDIATE")
        c.execute(_OUR_INSERT, ("s", n, EVENT.TYPE, 1, PAYLOAD, time.time_ns() // 1000, _HASH))
        c.execute("COMMIT")

    def head_one():
        c, n = tables["head"], v["head"] + 1
        v["head"] = n
        c.execute("BEGIN IMMEDIATE")
        at = time.time_ns() // 1000
        c.execute(_HEAD_UPDATE, (n, _HASH, at, "s", n - 1, _HASH if n > 1 else ""))
        c.execute(_OUR_INSERT, ("s", n, EVENT.TYPE, 1, PAYLOAD, at, _HASH))
        c.execute("COMMIT")

    async def ours_one():
        v["ours"] = await ours.append("s", [EVENT], v["ours"])

    async def thread_one():
        v["thread"] = await thread.append("s", [EVENT], v["thread"])

    return {"raw": raw_one, "our table": table_one, "+ head row": head_one,
            "ours": ours_one, "ours/writer": thread_one}, (ours, thread)


async def postgres_steps(schemas: list[str]):
    raw_schema, one_schema, our_schema = schemas
    settings = {"synchronous_commit": "on"}
    pool = await asyncpg.create_pool(PG_DSN, min_size=1, max_size=1,
                                     server_settings={**settings, "search_path": raw_schema})
    one = await asyncpg.connect(PG_DSN, server_settings={**settings, "search_path": one_schema})
    await one.execute(RAW_TABLE.format(pk="BIGSERIAL PRIMARY KEY"))
    async with pool.acquire() as conn:
        await conn.execute(RAW_TABLE.format(pk="BIGSERIAL PRIMARY KEY"))
    await upgrade(PG_URL, schema=our_schema)
    ours = await open_store(PG_URL, schema=our_schema)
    v = {"raw": 0, "one": 0, "ours": 0}
    insert = ("INSERT INTO raw_events (stream_id, version, type, data, recorded_at_us) "
              "VALUES ($1, $2, $3, $4, $5)")

    async def raw_one():
        v["raw"] += 1
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(insert, "s", v["raw"], EVENT.TYPE, PAYLOAD, time.time_ns() // 1000)

    async def one_one():
        v["one"] += 1
        await one.execute(insert, "s", v["one"], EVENT.TYPE, PAYLOAD, time.time_ns() // 1000)

    async def ours_one():
        v["ours"] = await ours.append("s", [EVENT], v["ours"])

    async def close():
        await ours.close()
        await one.close()
        await pool.close()

    return {"raw": raw_one, "raw 1 trip": one_one, "ours": ours_one}, close


async def measure(steps: dict, rounds: int, block: int) -> dict[str, list[float]]:
    """Median µs per event of every step, blocks interleaved round by round."""
    per_event: dict[str, list[float]] = {name: [] for name in steps}
    for name, step in steps.items():  # warm up: caches, statements, first pages
        for _ in range(20):
            r = step()
            if asyncio.iscoroutine(r):
                await r
    for _ in range(rounds):
        for name, step in steps.items():
            is_async = asyncio.iscoroutinefunction(step)
            t = time.perf_counter()
            for _ in range(block):
                if is_async:
                    await step()
                else:
                    step()
            per_event[name].append((time.perf_counter() - t) / block * 1e6)
    return per_event


def report(backend: str, per_event: dict[str, list[float]]) -> None:
    raw = statistics.median(per_event["raw"])
    print(f"\n{backend}: median µs per event (range over rounds); raw/step")
    for name, xs in per_event.items():
        med = statistics.median(xs)
        print(f"  {name:12} {med:8.0f}   ({min(xs):.0f}–{max(xs):.0f})   {raw / med:5.2f}x")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 50 events (CI)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.block = 3, 50
    # The asyncio floor, for scale: one loop iteration, one hand-off to a thread and back.
    loop = asyncio.get_running_loop()
    t = time.perf_counter()
    for _ in range(5000):
        await asyncio.sleep(0)
    tick = (time.perf_counter() - t) / 5000 * 1e6
    t = time.perf_counter()
    for _ in range(2000):
        await loop.run_in_executor(None, int)
    hop = (time.perf_counter() - t) / 2000 * 1e6
    t = time.perf_counter()
    for _ in range(5000):
        canonical_json(EVENT.to_data())
    enc = (time.perf_counter() - t) / 5000 * 1e6
    print(f"asyncio: one loop tick {tick:.1f} µs, thread hand-off and back (no work) {hop:.0f} µs;"
          f" encoding the event {enc:.1f} µs")
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            steps, stores = await sqlite_steps(tmp)
            try:
                report("sqlite", await measure(steps, args.rounds, args.block))
                print(f"  (inline commits: {stores[0].stats['inline']} of "
                      f"{stores[0].stats['batches']})")
            finally:
                for s in stores:
                    await s.close()
    if args.backend in ("postgres", "both"):
        schemas = [await pg_schema() for _ in range(3)]
        try:
            steps, close = await postgres_steps(schemas)
            try:
                report("postgres", await measure(steps, args.rounds, args.block))
            finally:
                await close()
        finally:
            for s in schemas:
                await drop_schema(s)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    asyncio.run(main())
