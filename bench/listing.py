"""The call list as the store grows: a small store against a big one, in the same run.

Support engineers list calls (`session-store calls`, the viewer's front page) on stores of
every size; a listing must cost what its page costs, not what the store holds. For SQLite and
PostgreSQL, two stores of short calls a minute apart (every 10th taken over, every 7th left
open, as a store that lost workers would be) are written straight into the tables, then each
listing the tools make is timed (median of repeats, warm connections):

- raw: the raw driver (sqlite3 / asyncpg) reads one page of heads in start order, the least
  any listing does;
- each `list_calls` filter the CLI and viewer offer, and `count_calls` (the "N calls match"
  line), which counts every matching call and so grows with the store by nature.

Printed: ms per listing on each store, the growth ratio (big / small: 1.0 is flat), and the
ratio to the raw page read on the big store.

    python bench/listing.py            # 1,000 against 100,000 calls
    python bench/listing.py --quick    # CI: 1,000 against 20,000 calls, fewer repeats
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile


import asyncpg

from callmix import (PG_DSN, PG_URL, drop_schema, machine, median_ms, pg_reachable,
                     pg_schema)
from session_store import events as ev, open_store
from session_store.audit import CallFilter
from session_store.audit.queries import count_calls, list_calls
from session_store.events import canonical_json
from session_store.storage.migrate import upgrade

T0_US = 1_767_225_600_000_000  # the first call starts at 2026-01-01 00:00 UTC
MINUTE_US = 60_000_000
PAGE = 50
RAW_PAGE = ("SELECT stream_id, version, epoch, created_at_us, updated_at_us FROM "
            "session_streams ORDER BY created_at_us DESC, stream_id DESC LIMIT {}")
EVENT_COLUMNS = ("tx_order", "stream_id", "version", "type", "schema_version", "data",
                 "recorded_at_us", "hash")
HEAD_COLUMNS = ("stream_id", "version", "last_hash", "epoch", "created_at_us", "updated_at_us")


def listings(calls: int) -> dict[str, tuple[str, CallFilter]]:
    """What the tools ask, by name: ("list" | "count", filter)."""
    middle = f"call-{calls // 2:06d}"
    return {
        "first page": ("list", CallFilter(limit=PAGE)),
        "page in the middle": ("list", CallFilter(limit=PAGE, after=middle)),
        "closed": ("list", CallFilter(limit=PAGE, status="closed")),
        "stale": ("list", CallFilter(limit=PAGE, status="stale")),
        "taken over": ("list", CallFilter(limit=PAGE, takeover=True)),
        "id search": ("list", CallFilter(limit=PAGE, search="4242")),
        "last hour": ("list", CallFilter(limit=PAGE,
                                         since_us=T0_US + (calls - 60) * MINUTE_US)),
        "count all": ("count", CallFilter()),
        "count closed": ("count", CallFilter(status="closed")),
    }


def store_rows(calls: int) -> tuple[list[tuple], list[tuple]]:
    """Event rows and head rows of `calls` short calls. Listings never read hashes: each row
    gets a unique placeholder instead of a chained hash."""
    payload = {name: (e.TYPE, e.SCHEMA, canonical_json(e.to_data())) for name, e in {
        "open": ev.SessionOpened("gemini-live", ["lookup_order"], "w1"),
        "ask": ev.ToolCallRequested("c1", "lookup_order", {"id": 1}, 1),
        "take": ev.WorkerAttached("w2", 2), "close": ev.SessionClosed()}.items()}
    rows, heads = [], []
    for i in range(calls):
        sid, start = f"call-{i:06d}", T0_US + i * MINUTE_US
        names = ["open", "ask"] + ["take"] * (i % 10 == 0) + ["close"] * (i % 7 != 0)
        for version, name in enumerate(names, start=1):
            etype, schema, data = payload[name]
            rows.append((0, sid, version, etype, schema, data, start + version * 1000,
                         f"{i:058x}{version:06x}"))
        heads.append((sid, len(names), rows[-1][-1], 1, start + 1000,
                       start + len(names) * 1000))
    return rows, heads


def insert_sql(table: str, columns: tuple[str, ...]) -> str:
    return (f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' * len(columns))})")


class SqliteSide:
    name = "sqlite"

    def __init__(self, directory: str, calls: int):
        self.path = f"{directory}/listing-{calls}.db"
        self.url, self.options = f"sqlite+aiosqlite:///{self.path}", {}

    async def create(self, rows: list[tuple], heads: list[tuple]) -> None:
        await upgrade(self.url)
        conn = sqlite3.connect(self.path)
        with conn:
            conn.executemany(insert_sql("session_events", EVENT_COLUMNS), rows)
            conn.executemany(insert_sql("session_streams", HEAD_COLUMNS), heads)
        conn.execute("ANALYZE")
        self.raw = conn

    async def raw_page(self) -> None:
        self.raw.execute(RAW_PAGE.format(PAGE + 1)).fetchall()

    async def close(self) -> None:
        self.raw.close()


class PostgresSide:
    name = "postgres"

    def __init__(self, directory: str, calls: int):
        self.url = PG_URL

    async def create(self, rows: list[tuple], heads: list[tuple]) -> None:
        self.schema = await pg_schema()
        self.options = {"schema": self.schema}
        await upgrade(self.url, schema=self.schema)
        self.raw = await asyncpg.connect(PG_DSN, server_settings={"search_path": self.schema})
        async with self.raw.transaction():
            await self.raw.copy_records_to_table("session_events", records=rows,
                                                 columns=EVENT_COLUMNS)
            await self.raw.copy_records_to_table("session_streams", records=heads,
                                                 columns=HEAD_COLUMNS)
        await self.raw.execute("ANALYZE")

    async def raw_page(self) -> None:
        await self.raw.fetch(RAW_PAGE.format(PAGE + 1))

    async def close(self) -> None:
        await self.raw.close()
        await drop_schema(self.schema)


async def measure(side_type, directory: str, calls: int, repeats: int) -> dict[str, float]:
    side = side_type(directory, calls)
    await side.create(*store_rows(calls))
    store = await open_store(side.url, **side.options)
    now_us = T0_US + (calls + 24 * 60) * MINUTE_US  # a day after the last call started
    try:
        await side.raw_page()  # warm: plans cached, pages in memory
        out = {"raw page": await median_ms(side.raw_page, repeats)}
        for name, (kind, flt) in listings(calls).items():
            query = list_calls if kind == "list" else count_calls
            await query(store, flt, now_us)
            out[name] = await median_ms(lambda q=query, f=flt: q(store, f, now_us), repeats)
        return out
    finally:
        await store.close()
        await side.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller big store (CI)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    small, big = 1_000, 20_000 if args.quick else 100_000
    repeats = 5 if args.quick else 15
    sides = [SqliteSide, PostgresSide] if args.backend == "both" else (
        [SqliteSide] if args.backend == "sqlite" else [PostgresSide])
    if PostgresSide in sides and not await pg_reachable():
        print(f"PostgreSQL not reachable at {PG_DSN}: skipping it")
        sides.remove(PostgresSide)
    print(f"{machine()}; median ms of {repeats}; pages of {PAGE}")
    with tempfile.TemporaryDirectory() as directory:
        for side in sides:
            a = await measure(side, directory, small, repeats)
            b = await measure(side, directory, big, repeats)
            print(f"\n{side.name}: {small:,} calls against {big:,}")
            print(f"{'listing':22} {f'{small:,}':>9} {f'{big:,}':>9} {'growth':>7} "
                  f"{'/ raw page':>10}")
            for name in a:
                print(f"{name:22} {a[name]:>9.2f} {b[name]:>9.2f} {b[name] / a[name]:>6.1f}x "
                      f"{b[name] / b['raw page']:>9.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
