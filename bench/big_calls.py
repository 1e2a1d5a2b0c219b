"""The support tools on a big call: time to first byte, total time and peak memory of
`state`, `export` and `timeline --json`, against a raw read of the same rows in the same run.

A SQLite log holds one call of `n` 10 MB messages between small events (100 MB by default).
Each command runs as its own process (as a user runs it); the raw floor is a process that
reads the call's rows with sqlite3 and writes their JSON. Then the viewer (`session-store
serve`, its own process) exports the call: time to first byte, and its resident memory
before, at the peak and after (does it keep what one export took?).

    python bench/big_calls.py            # a 100 MB call
    python bench/big_calls.py --quick    # CI: a 20 MB call
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


import httpx

from callmix import machine
from live_clients import free_port
from session_store import events as ev, open_store
from session_store.storage.migrate import upgrade

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from session_store.commands.cli import app; app()"]
RAW = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for (data,) in db.execute("SELECT data FROM session_events WHERE stream_id = 'big' "
                          "ORDER BY version"):
    sys.stdout.write(data + "\\n")
"""


async def write_big_call(url: str, n: int) -> None:
    await upgrade(url)
    store = await open_store(url)
    try:
        v = await store.append("big", [ev.SessionOpened("gemini-live", ["lookup"], "w1", 1),
                                       ev.Connected(1)], 0)
        for i in range(n):
            v = await store.append("big", [ev.ConversationMessage(
                "user", f"{i} " + "x" * 10_000_000, 1)], v)
        await store.append("big", [ev.ToolCallRequested("c1", "lookup", {"q": "small"}, 1)], v)
    finally:
        await store.close()


def run(argv: list[str]) -> dict:
    """Run a process; time to its first byte on stdout, total time, output size, peak RSS."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # Peak RSS as GNU time reports it: a child forked from this (big) process would count
    # the pages it shared with it before its exec.
    with tempfile.NamedTemporaryFile("r") as peak:
        t = time.perf_counter()
        proc = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", peak.name, *argv],
                                stdout=subprocess.PIPE, env=env)
        first = proc.stdout.read(1)
        ttfb = time.perf_counter() - t
        size = len(first)
        while chunk := proc.stdout.read(1 << 20):
            size += len(chunk)
        assert proc.wait() == 0, argv
        total = time.perf_counter() - t
        peak_kb = int(peak.read().split()[-1])
    return {"ttfb_s": ttfb, "total_s": total, "bytes": size, "peak_mb": peak_kb / 1024}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def viewer_export(url: str) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    viewer = subprocess.Popen([*CLI, "serve", "--db", url, "--port", str(port)],
                              env=dict(os.environ, PYTHONPATH=str(REPO)),
                              stdout=subprocess.DEVNULL)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=300) as http:
            for _ in range(100):
                try:
                    (await http.get("/api/calls")).raise_for_status()
                    break
                except httpx.HTTPError:
                    await asyncio.sleep(0.2)
            before = rss_mb(viewer.pid)
            peak = before
            t = time.perf_counter()
            ttfb = None
            async with http.stream("GET", "/export/big") as r:
                async for _chunk in r.aiter_bytes():
                    ttfb = ttfb if ttfb is not None else time.perf_counter() - t
                    peak = max(peak, rss_mb(viewer.pid))
            total = time.perf_counter() - t
            await asyncio.sleep(1)
            return {"ttfb_s": ttfb, "total_s": total, "rss_before_mb": before,
                    "rss_peak_mb": peak, "rss_after_mb": rss_mb(viewer.pid)}
    finally:
        viewer.terminate()
        viewer.wait(15)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI: a 20 MB call")
    args = parser.parse_args()
    n = 2 if args.quick else 10
    print(f"big calls: one call of {n} x 10 MB messages, SQLite ({machine()})")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.db"
        url = f"sqlite+aiosqlite:///{path}"
        await write_big_call(url, n)
        raw = run([sys.executable, "-c", RAW, str(path)])
        print(f"{'command':22} {'first byte s':>12} {'total s':>8} {'peak MB':>8} "
              f"{'out MB':>7} {'total/raw':>9} {'peak/raw':>8}")
        rows = [("raw rows (floor)", raw)]
        for name, argv in (("state", ["state", "big"]), ("export", ["export", "big"]),
                           ("timeline --json", ["timeline", "big", "--json"])):
            rows.append((name, run([*CLI, *argv, "--db", url])))
        for name, r in rows:
            print(f"{name:22} {r['ttfb_s']:12.2f} {r['total_s']:8.2f} {r['peak_mb']:8.0f} "
                  f"{r['bytes'] / 1e6:7.1f} {r['total_s'] / raw['total_s']:8.1f}x "
                  f"{r['peak_mb'] / raw['peak_mb']:7.1f}x")
        v = await viewer_export(url)
        print(f"viewer GET /export: first byte {v['ttfb_s']:.2f} s, total {v['total_s']:.2f} s;"
              f" viewer RSS {v['rss_before_mb']:.0f} MB before, {v['rss_peak_mb']:.0f} MB "
              f"peak, {v['rss_after_mb']:.0f} MB after")


if __name__ == "__main__":
    asyncio.run(main())
