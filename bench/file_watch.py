"""What the SQLite file watch costs a commit (session_store/storage/sqlite/watch.py).

Each commit the store acknowledges is first checked against SQLite's WAL index and the
database file's header (a few preads of cached pages). Here, in the same run on the same
file: plain sqlite3 commits (WAL, synchronous=FULL, one ~200-byte row each) against the
same commits each followed by the check, alternating commit by commit so that both see
the same disk and WAL; and the check alone. Prints per-commit p50/p99 and the ratio watched/plain.
Then what the writer's checkpoint (every 32 commits) gains from the watch: a few pages it
cannot write, read before and after it (`witness`), against the checkpoint itself.

    python bench/file_watch.py            # 3 rounds of 1000 commits each way
    python bench/file_watch.py --quick    # CI smoke run
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time

from session_store.storage.sqlite.watch import FileWatch

ROW = "x" * 200


def _commit(conn: sqlite3.Connection, watch: FileWatch | None) -> float:
    t = time.perf_counter()
    conn.execute("INSERT INTO t (data) VALUES (?)", (ROW,))
    if watch is not None:
        watch.check()
    return time.perf_counter() - t


def _p(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=1000)
    args = parser.parse_args()
    n, rounds = (200, 1) if args.quick else (args.n, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "watch.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, data TEXT)")
        watch = FileWatch(path)
        watch.check()
        plain, watched = [], []
        for _ in range(rounds * n):  # (alternating: both see the same disk and WAL size)
            plain.append(_commit(conn, None))
            watched.append(_commit(conn, watch))
        alone = []
        for _ in range(n):
            t = time.perf_counter()
            watch.check()
            alone.append(time.perf_counter() - t)
        # The writer's checkpoints: every 32 commits (child.IDLE_CHECKPOINT_AFTER), the pages
        # they cannot write read before and after (`witness`), against the checkpoint alone.
        witnessed, checkpointed = [], []
        for _ in range(max(n // 32, 10)):
            for _ in range(32):
                _commit(conn, None)
            t = time.perf_counter()
            witness = watch.witness()
            t_ck = time.perf_counter()
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            t_after = time.perf_counter()
            watch.check_witness(witness)
            witnessed.append(t_ck - t + time.perf_counter() - t_after)
            checkpointed.append(t_after - t_ck)
            watch.check()
        watch.close()
        conn.close()
    print(f"{'':<22}{'p50 us':>10}{'p99 us':>10}")
    print(f"{'commit':<22}{_p(plain, 50):>10.1f}{_p(plain, 99):>10.1f}")
    print(f"{'commit + check':<22}{_p(watched, 50):>10.1f}{_p(watched, 99):>10.1f}")
    print(f"{'check alone':<22}{_p(alone, 50):>10.1f}{_p(alone, 99):>10.1f}")
    print(f"{'checkpoint (32)':<22}{_p(checkpointed, 50):>10.1f}{_p(checkpointed, 99):>10.1f}")
    print(f"{'its witness':<22}{_p(witnessed, 50):>10.1f}{_p(witnessed, 99):>10.1f}")
    print(f"ratio watched/plain: p50 x{_p(watched, 50) / _p(plain, 50):.3f}, "
          f"p99 x{_p(watched, 99) / _p(plain, 99):.3f} ({rounds} x {n} commits each way)")


if __name__ == "__main__":
    main()
