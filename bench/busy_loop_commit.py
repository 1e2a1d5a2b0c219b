"""A durable commit while the event loop is busy: a thread against the store's writer process.

In a live call the event loop is rarely idle: audio frames, transcripts, the pipeline's
processors. A commit that runs on a thread must take the GIL back from that loop after each
sqlite3 call; the store's SQLite writer is a process of its own and answers through a pipe.
This measures one commit as the coroutine that awaits it sees it, with the loop idle and with
`--load` tasks doing Python work in 0.3 ms slices (a loop turn between slices), in one run:

  thread   raw sqlite3 on a thread (run_in_executor), one INSERT per transaction
           (WAL, synchronous=FULL): how SQLite stores commit off the loop
  ours     store.append, default store (the writer process)

Rounds alternate the two, so both see the same machine; prints p50/p99 per load, how many
commits fit (each measurement stops after --budget seconds: on a thread under load one commit
can take seconds) and the ratio thread/ours (above 1: ours is faster).

    python bench/busy_loop_commit.py            # 150 commits per round, 3 rounds
    python bench/busy_loop_commit.py --quick    # CI smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sqlite3
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


from append import EVENT, PAYLOAD, RAW_TABLE
from callmix import pct

from session_store import open_store
from session_store.storage.migrate import upgrade

SLICE_S = 0.0003


async def _busy(stop: asyncio.Event) -> None:
    """Python work in short slices, a loop turn between them (a stand-in for audio frames)."""
    while not stop.is_set():
        until = time.perf_counter() + SLICE_S
        while time.perf_counter() < until:
            pass
        await asyncio.sleep(0)


async def _measure(commit, n: int, load: int, budget_s: float) -> list[float]:
    """Up to `n` commits, or as many as fit in `budget_s` (a thread under load can take
    seconds for one)."""
    stop = asyncio.Event()
    workers = [asyncio.create_task(_busy(stop)) for _ in range(load)]
    took: list[float] = []
    until = time.perf_counter() + budget_s
    try:
        while len(took) < n and time.perf_counter() < until:
            started = time.perf_counter()
            await commit()
            took.append((time.perf_counter() - started) * 1e3)
            await asyncio.sleep(0.001)  # commits a little apart, as a call's are
    finally:
        stop.set()
        await asyncio.gather(*workers)
    return took


async def main(args) -> None:
    tmp = tempfile.mkdtemp(prefix="busy-loop-", dir=args.dir)
    raw = sqlite3.connect(f"{tmp}/raw.db", isolation_level=None, check_same_thread=False)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=FULL")
    raw.execute(RAW_TABLE.format(pk="INTEGER PRIMARY KEY"))
    thread = ThreadPoolExecutor(1)
    raw_version = 0

    def raw_one() -> None:
        nonlocal raw_version
        raw_version += 1
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("INSERT INTO raw_events (stream_id, version, type, data, recorded_at_us) "
                    "VALUES (?, ?, ?, ?, ?)",
                    ("s", raw_version, EVENT.TYPE, PAYLOAD, time.time_ns() // 1000))
        raw.execute("COMMIT")

    async def thread_commit() -> None:
        await asyncio.get_running_loop().run_in_executor(thread, raw_one)

    url = f"sqlite+aiosqlite:///{tmp}/ours.db"
    await upgrade(url)
    store = await open_store(url)
    version = 0

    async def ours_commit() -> None:
        nonlocal version
        version = await store.append("s", [EVENT], version)

    results: dict[tuple[str, int], list[float]] = {}
    try:
        await ours_commit()
        for _ in range(args.rounds):
            for load in args.loads:
                for name, commit in (("thread", thread_commit), ("ours", ours_commit)):
                    results.setdefault((name, load), []).extend(
                        await _measure(commit, args.commits, load, args.budget))
    finally:
        await store.close()
        thread.shutdown()
        raw.close()
    print(f"One durable commit as its awaiting coroutine sees it (ms), {args.rounds} rounds "
          f"x {args.commits} commits; load = tasks doing Python work in "
          f"{SLICE_S * 1e3:.1f} ms slices")
    print(f"{'load':>4}  {'thread p50':>10} {'p99':>8} {'n':>4}  {'ours p50':>9} {'p99':>8} "
          f"{'n':>4}  {'thread/ours p50':>15} {'p99':>6}")
    for load in args.loads:
        t, o = results[("thread", load)], results[("ours", load)]
        # Under load one commit on a thread can outlast the whole budget, so a side may have
        # one measurement or none: its percentiles are then that value or nan, never an error.
        print(f"{load:>4}  {pct(t, 50):>10.2f} {pct(t, 99):>8.2f} {len(t):>4}  "
              f"{pct(o, 50):>9.2f} {pct(o, 99):>8.2f} {len(o):>4}  "
              f"{_ratio(pct(t, 50), pct(o, 50)):>14.2f}x {_ratio(pct(t, 99), pct(o, 99)):>5.2f}x")
    short = [f"{name} at load {load}" for (name, load), took in results.items()
             if len(took) < args.commits]
    if short:
        print(f"fewer than {args.commits} commits fit in {args.budget:g} s for: "
              + ", ".join(short))


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commits", type=int, default=150)
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=float, default=10.0,
                        help="seconds at most per measurement (commits, one load, one way)")
    parser.add_argument("--dir", default=None, help="where the databases go (default: TMPDIR)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.commits, args.loads, args.budget = 1, 40, [0, 1], 3.0
    asyncio.run(main(args))
