"""The floor under a durable tool call: the raw driver's two commits, spaced as a turn's are.

A tool call in our service waits for two write-ahead commits (the request with its start;
the result with the intent to send it). Each comes after the log was idle: ~15 ms since the
previous turn for the first, the tool's run for the second. On the disks these benchmarks
run on, a commit after an idle spell costs 2-3x one that follows another at once (raw
sqlite3, WAL, synchronous=FULL: 0.4 ms back to back, 1.0-1.4 ms after 5-20 ms idle, with
the idle spent sleeping or spinning alike: it is the disk's sync, not the CPU waking). So
the fair floor for "added latency per turn" is not two back-to-back commits but two commits
after the same idle spells, by the raw driver, measured in the same run:
`bench/turn_overhead.py` prints it next to what ours adds.

    python bench/commit_floor.py             # 120 turns each: SQLite, PostgreSQL if reachable
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
import uuid


from append import EVENT, PAYLOAD, PG_DSN, RAW_TABLE
from callmix import pct

# Idle before the turn's first commit (the previous turn's tail and this turn's audio), and
# between its two commits (the tool runs; the bench's tool answers at once).
IDLE_BEFORE_S = 0.015
IDLE_BETWEEN_S = 0.001
_INSERT = ("INSERT INTO raw_events (stream_id, version, type, data, recorded_at_us) "
           "VALUES ({})")


class CommitFloor:
    """Two raw commits per turn; `turn()` returns their summed time in ms (sleeps excluded)."""

    async def open(self) -> None:
        raise NotImplementedError

    async def commit(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    async def turn(self) -> float:
        spent = 0.0
        for idle in (IDLE_BEFORE_S, IDLE_BETWEEN_S):
            await asyncio.sleep(idle)
            started = time.perf_counter()
            await self.commit()
            spent += time.perf_counter() - started
        return spent * 1e3

    async def turns(self, n: int) -> list[float]:
        return [await self.turn() for _ in range(n)]


class SqliteFloor(CommitFloor):
    """sqlite3 on the loop's thread (nothing else runs meanwhile), one INSERT per commit."""

    def __init__(self, directory: str):
        self.path = f"{directory}/floor-{uuid.uuid4().hex[:6]}.db"
        self.version = 0

    async def open(self) -> None:
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute(RAW_TABLE.format(pk="INTEGER PRIMARY KEY"))

    async def commit(self) -> None:
        self.version += 1
        self.conn.execute(_INSERT.format("?, ?, ?, ?, ?"), (
            "s", self.version, EVENT.TYPE, PAYLOAD, time.time_ns() // 1000))

    async def close(self) -> None:
        self.conn.close()


class PostgresFloor(CommitFloor):
    """asyncpg, one INSERT in its own implicit transaction (synchronous_commit on)."""

    def __init__(self):
        self.schema = f"floor_{uuid.uuid4().hex[:10]}"
        self.version = 0

    async def open(self) -> None:
        import asyncpg
        self.conn = await asyncpg.connect(PG_DSN, timeout=5)
        await self.conn.execute(f"CREATE SCHEMA {self.schema}")
        await self.conn.execute(f"SET search_path TO {self.schema}")
        await self.conn.execute(RAW_TABLE.format(pk="BIGSERIAL PRIMARY KEY"))

    async def commit(self) -> None:
        self.version += 1
        await self.conn.execute(_INSERT.format("$1, $2, $3, $4, $5"), "s", self.version,
                                EVENT.TYPE, PAYLOAD, time.time_ns() // 1000)

    async def close(self) -> None:
        try:
            await self.conn.execute(f"DROP SCHEMA {self.schema} CASCADE")
        finally:
            await self.conn.close()


def floor_for(backend: str, directory: str) -> CommitFloor:
    """The raw floor matching one of bench/turn_overhead.py's stores."""
    return PostgresFloor() if backend == "postgres" else SqliteFloor(directory)


async def main(turns: int, with_postgres: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["sqlite"] + (["postgres"] if with_postgres else []):
            floor = floor_for(name, tmp)
            await floor.open()
            try:
                ms = await floor.turns(turns)
            finally:
                await floor.close()
            print(f"{name:<10} two raw commits per turn: p50 {pct(ms, 50):5.2f}  "
                  f"p90 {pct(ms, 90):5.2f}  p99 {pct(ms, 99):5.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=120)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.turns, not args.no_postgres))
