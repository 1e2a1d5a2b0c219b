"""Tailing reads of the log (`read_all`, what `subscribe` and `tail` run) against the raw
driver, in the same run.

A follower reads a page after its cursor, or finds itself caught up (an empty page), several
times a second. On PostgreSQL that read also works out which running transactions may still
commit rows before what it returns (the horizon, storage/postgres/statements.py); the raw
driver's read orders by position alone, which is the least a page costs (and is not safe to
tail with there: it skips rows that commit late). For SQLite and PostgreSQL, a log of short
calls is written, then each read is timed (median of repeats, warm connections):

- a page of 500 events from the middle of the log, and
- a caught-up read (nothing after the cursor).

Printed: ms per read, ours and raw, and the ratio ours / raw.

    python bench/tail_reads.py            # 20,000 events, 300 repeats
    python bench/tail_reads.py --quick    # CI: 5,000 events, 100 repeats
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
from pathlib import Path


import asyncpg

from callmix import (PG_DSN, PG_URL, drop_schema, machine, median_ms, pg_reachable,
                     pg_schema)
from session_store import events as ev, open_store
from session_store.storage.migrate import upgrade

PAGE = 500
RAW_PAGE = ("SELECT stream_id, version, position, type, schema_version, data, recorded_at_us, "
            "hash FROM session_events WHERE position > {} ORDER BY position LIMIT {}")


async def write_log(store, events: int) -> list[int]:
    """`events` conversation messages in calls of 100; the positions, in order."""
    for k in range(events // 100):
        await store.append(f"call-{k:05d}", [ev.ConversationMessage(role="user", text=f"m{i}")
                                             for i in range(100)], 0)
    return [r.position for r in await store.read_all(0, limit=events)]


async def measure(store, raw_read, positions: list[int], repeats: int) -> dict[str, tuple]:
    middle, last = positions[len(positions) // 2], positions[-1]
    out = {}
    for name, cursor in (("page of 500", middle), ("caught up", last)):
        ours = await median_ms(lambda c=cursor: store.read_all(c, PAGE), repeats)
        raw = await median_ms(lambda c=cursor: raw_read(c), repeats)
        out[name] = (ours, raw)
    return out


async def on_sqlite(events: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tail.db"
        url = f"sqlite+aiosqlite:///{path}"
        await upgrade(url)
        store = await open_store(url)
        raw = sqlite3.connect(path)
        try:
            positions = await write_log(store, events)

            async def raw_read(cursor):
                return raw.execute(RAW_PAGE.format(int(cursor), PAGE)).fetchall()
            return await measure(store, raw_read, positions, repeats)
        finally:
            raw.close()
            await store.close()


async def on_postgres(events: int, repeats: int) -> dict:
    schema = await pg_schema()
    try:
        await upgrade(PG_URL, schema=schema)
        store = await open_store(PG_URL, schema=schema)
        raw = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
        try:
            positions = await write_log(store, events)
            await raw.execute("ANALYZE session_events")

            async def raw_read(cursor):
                return await raw.fetch(RAW_PAGE.format(int(cursor), PAGE))
            return await measure(store, raw_read, positions, repeats)
        finally:
            await raw.close()
            await store.close()
    finally:
        await drop_schema(schema)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI: a smaller log, fewer repeats")
    args = parser.parse_args()
    events, repeats = (5_000, 100) if args.quick else (20_000, 300)
    print(f"tailing reads: {events:,} events, median of {repeats} reads ({machine()})")
    results = {"sqlite": await on_sqlite(events, repeats)}
    if await pg_reachable():
        results["postgres"] = await on_postgres(events, repeats)
    else:
        print("PostgreSQL is not reachable: its half is skipped")
    print(f"{'database':10} {'read':14} {'ours ms':>8} {'raw ms':>8} {'ours/raw':>9}")
    for db, rows in results.items():
        for name, (ours, raw) in rows.items():
            print(f"{db:10} {name:14} {ours:8.3f} {raw:8.3f} {ours / raw:8.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
