"""The support tools on a big call: time to first byte, total time and peak memory of
`state`, `timeline` (text and --json) and `export`, against a raw read of the same rows in
the same run.

A SQLite log holds one call of `n` 10 MB messages between small events (100 MB by default).
Each command runs as its own process (as a user runs it); the raw floor is a process that
reads the call's rows with sqlite3 and writes their JSON. Then the viewer (`session-store
serve`, its own process) shows the call's page, its state, and exports it: time to first
byte, and its resident memory before, at the peak and after (does it keep what it took?).

    python bench/big_calls.py            # a 100 MB call
    python bench/big_calls.py --quick    # CI: a 20 MB call
    python bench/big_calls.py --code DIR # also the same with another checkout's code
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


import httpx

from callmix import machine
from live_clients import free_port
from session_store import events as ev, open_store
from session_store.storage.migrate import upgrade

REPO = Path(__file__).resolve().parent.parent
# A process's peak resident memory, written at its exit (VmHWM): GNU time's %M gave the
# same figure here for commands whose peaks differ by 100 MB.
PEAK = """
import atexit, os
def _peak():
    with open(os.environ["BENCH_PEAK_FILE"], "w") as f:
        f.write(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")))
atexit.register(_peak)
"""
CLI = [sys.executable, "-c", PEAK + "from session_store.commands.cli import app; app()"]
RAW = PEAK + """
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


def run(argv: list[str], code: Path = REPO) -> dict:
    """Run a process; time to its first byte on stdout, total time, output size, peak RSS."""
    with tempfile.NamedTemporaryFile("r") as peak:
        env = dict(os.environ, PYTHONPATH=str(code), BENCH_PEAK_FILE=peak.name)
        t = time.perf_counter()
        # (cwd: `python -c` puts the working directory first on sys.path)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, cwd=code)
        first = proc.stdout.read(1)
        ttfb = time.perf_counter() - t
        size = len(first)
        while chunk := proc.stdout.read(1 << 20):
            size += len(chunk)
        assert proc.wait() == 0, argv
        total = time.perf_counter() - t
        peak_kb = int(peak.read())
    return {"ttfb_s": ttfb, "total_s": total, "bytes": size, "peak_mb": peak_kb / 1024}


class RssPeak:
    """The highest resident memory of a process, sampled every 5 ms in a thread."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._done = pid, rss_mb(pid), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, rss_mb(self.pid))

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return max(self.peak, rss_mb(self.pid))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def viewer_pages(url: str, code: Path = REPO) -> dict:
    """The call's page, its state and its export from one viewer, one after the other."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    viewer = subprocess.Popen([*CLI, "serve", "--db", url, "--port", str(port)],
                              env=dict(os.environ, PYTHONPATH=str(code),
                                       BENCH_PEAK_FILE=os.devnull),
                              stdout=subprocess.DEVNULL, cwd=code)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=300) as http:
            for _ in range(100):
                try:
                    (await http.get("/api/calls")).raise_for_status()
                    break
                except httpx.HTTPError:
                    await asyncio.sleep(0.2)
            out = {"rss_start_mb": rss_mb(viewer.pid)}
            for name, path in (("page", "/calls/big"), ("state", "/api/state/big"),
                               ("export", "/export/big")):
                before = rss_mb(viewer.pid)
                sampler = RssPeak(viewer.pid)  # (also while the answer is being built)
                t = time.perf_counter()
                ttfb = None
                async with http.stream("GET", path) as r:
                    r.raise_for_status()
                    async for _chunk in r.aiter_bytes():
                        ttfb = ttfb if ttfb is not None else time.perf_counter() - t
                total = time.perf_counter() - t
                peak = sampler.stop()
                await asyncio.sleep(1)
                out[name] = {"ttfb_s": ttfb, "total_s": total, "rss_before_mb": before,
                             "rss_peak_mb": peak, "rss_after_mb": rss_mb(viewer.pid)}
            return out
    finally:
        viewer.terminate()
        viewer.wait(15)


COMMANDS = (("state", ["state", "big"]), ("state --json", ["state", "big", "--json"]),
            ("timeline", ["timeline", "big"]), ("timeline --json", ["timeline", "big", "--json"]),
            ("export", ["export", "big"]))


def report(url: str, raw: dict, code: Path) -> None:
    print(f"{'command':22} {'first byte s':>12} {'total s':>8} {'peak MB':>8} "
          f"{'out MB':>7} {'total/raw':>9} {'peak/raw':>8}")
    rows = [("raw rows (floor)", raw)]
    rows += [(name, run([*CLI, *argv, "--db", url], code)) for name, argv in COMMANDS]
    for name, r in rows:
        print(f"{name:22} {r['ttfb_s']:12.2f} {r['total_s']:8.2f} {r['peak_mb']:8.0f} "
              f"{r['bytes'] / 1e6:7.1f} {r['total_s'] / raw['total_s']:8.1f}x "
              f"{r['peak_mb'] / raw['peak_mb']:7.1f}x")
    v = asyncio.run(viewer_pages(url, code))
    print(f"viewer RSS at start {v['rss_start_mb']:.0f} MB")
    for name in ("page", "state", "export"):
        r = v[name]
        print(f"viewer GET {name:7}: first byte {r['ttfb_s']:.2f} s, total {r['total_s']:.2f} s;"
              f" RSS {r['rss_before_mb']:.0f} MB before, {r['rss_peak_mb']:.0f} MB peak, "
              f"{r['rss_after_mb']:.0f} MB after")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI: a 20 MB call")
    parser.add_argument("--code", type=Path, help="Also run the tools from this checkout "
                        "(another version of the code: a before/after in one run).")
    args = parser.parse_args()
    n = 2 if args.quick else 10
    print(f"big calls: one call of {n} x 10 MB messages, SQLite ({machine()})")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.db"
        url = f"sqlite+aiosqlite:///{path}"
        asyncio.run(write_big_call(url, n))
        raw = run([sys.executable, "-c", RAW, str(path)])
        for code in ([args.code] if args.code else []) + [REPO]:
            print(f"\ncode: {code}")
            report(url, raw, code)


if __name__ == "__main__":
    main()
