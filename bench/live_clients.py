"""Live viewer clients against the bots' appends, on PostgreSQL, in the same run.

The bots (this process: `calls` open calls appending the scripted event mix of bench/callmix.py
through one store) run twice: first with nobody watching, then with `clients` browsers on the
viewer's live pages (`GET /api/live/CALL`, server-sent events; a child process) spread over
those calls. The viewer is `session-store serve` in its own process, as in production.

Printed: the bots' append p50/p99 in each phase and their ratio (with clients / without), the
PostgreSQL connections the viewer process holds before and with the clients, the updates the
clients received, and how long the viewer takes to answer its call list meanwhile.

    python bench/live_clients.py            # 40 calls, 500 clients, 30 s per phase
    python bench/live_clients.py --quick    # CI: 10 calls, 100 clients, 8 s per phase
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


import httpx

from callmix import (PG_URL, call_script, drop_schema, machine, ms, pct,
                     pg_reachable, pg_schema)
from pg_connections import pg_connections
from session_store import open_store
from session_store.storage.migrate import upgrade


RAMP_S = 10.0  # the clients open their pages over this long


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def bots(store, calls: list[str], versions: dict[str, int], window: float) -> dict:
    """Each call appends its script's next steps (its session.opened is already written)
    for `window` seconds; the latency of each append."""
    latencies: list[float] = []
    end = time.perf_counter() + window

    async def call(i: int, stream: str) -> None:
        script = call_script(random.Random(versions[stream] * 7919 + i), stream,
                             first_delay=random.uniform(0, 1))
        next(script)  # (session.opened: written before)
        for pause, events in script:
            if time.perf_counter() + pause >= end:
                return
            await asyncio.sleep(pause)
            t = time.perf_counter()
            versions[stream] = await store.append(stream, events, versions[stream])
            latencies.append(time.perf_counter() - t)

    await asyncio.gather(*(call(i, c) for i, c in enumerate(calls)))
    return {"appends": len(latencies), "p50_ms": ms(pct(latencies, 50)),
            "p99_ms": ms(pct(latencies, 99))}


async def list_page_ms(base: str, repeats: int = 5) -> float:
    """The viewer's call list, median answer time."""
    times = []
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        for _ in range(repeats):
            t = time.perf_counter()
            (await http.get("/api/calls")).raise_for_status()
            times.append(time.perf_counter() - t)
            await asyncio.sleep(0.2)
    return ms(sorted(times)[len(times) // 2])


async def clients_child(base: str, calls: list[str], clients: int, seconds: float) -> None:
    """(The child process.) `clients` live pages over `calls`; prints what they got."""
    opened, updates, errors = [0], [0], []
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=0)

    async def browse(http, call: str) -> None:
        try:
            async with http.stream("GET", f"/api/live/{call}") as stream:
                opened[0] += 1
                async for line in stream.aiter_lines():
                    if line.startswith("data:"):
                        updates[0] += 1
        except (httpx.HTTPError, asyncio.CancelledError) as exc:
            if not isinstance(exc, asyncio.CancelledError):
                errors.append(f"{type(exc).__name__}: {exc}")

    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(60, read=None),
                                 limits=limits) as http:
        tasks = []
        for i in range(clients):  # browsers arrive over RAMP_S, not all in one instant
            tasks.append(asyncio.create_task(browse(http, calls[i % len(calls)])))
            await asyncio.sleep(RAMP_S / clients)
        print(json.dumps({"started": True}), flush=True)
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"opened": opened[0], "updates": updates[0], "errors": len(errors),
                      "first_error": errors[0] if errors else None}), flush=True)


async def run(calls_n: int, clients: int, window: float) -> dict:
    schema = await pg_schema()
    viewer = None
    try:
        await upgrade(PG_URL, schema=schema)
        store = await open_store(PG_URL, schema=schema)
        calls = [f"call-{i}" for i in range(calls_n)]
        versions = {}
        for c in calls:
            script = call_script(random.Random(1), c)
            versions[c] = await store.append(c, next(script)[1], 0)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        viewer = subprocess.Popen(
            [sys.executable, "-c", "from session_store.commands.cli import app; app()", "serve",
             "--db", PG_URL, "--schema", schema, "--port", str(port)],
            env=env, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/api/calls", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or viewer.poll() is not None:
                    raise RuntimeError("the viewer did not start") from None
                await asyncio.sleep(0.2)
        out = {"viewer_connections_idle": pg_connections(viewer.pid)}
        out["quiet"] = await bots(store, calls, versions, window)
        out["quiet"]["list_ms"] = await list_page_ms(base)
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--child", base, "--clients", str(clients),
            "--calls", str(calls_n), "--seconds", str(window + 15),
            stdout=subprocess.PIPE, env=env)
        await child.stdout.readline()  # all started
        await asyncio.sleep(2)  # (the last pages open: each reads its call's state)
        watched = asyncio.create_task(bots(store, calls, versions, window))
        await asyncio.sleep(window / 2)
        out["viewer_connections_clients"] = pg_connections(viewer.pid)
        out["list_ms_clients"] = await list_page_ms(base)
        out["watched"] = await watched
        out["clients"] = json.loads((await child.stdout.readline()) or b"{}")
        await child.wait()
        await store.close()
        return out
    finally:
        if viewer is not None:
            viewer.send_signal(signal.SIGINT)
            try:
                viewer.wait(15)
            except subprocess.TimeoutExpired:
                viewer.kill()
        await drop_schema(schema)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI: 10 calls, 100 clients, 8 s")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int)
    parser.add_argument("--calls", type=int)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        await clients_child(args.child, [f"call-{i}" for i in range(args.calls)],
                            args.clients, args.seconds)
        return 0
    calls, clients, window = (10, 100, 8.0) if args.quick else (40, 500, 30.0)
    calls, clients = args.calls or calls, args.clients or clients
    if not await pg_reachable():
        print("PostgreSQL is not reachable: skipped")
        return 0
    print(f"live viewer clients: {calls} bot calls, {clients} clients, {window:g} s per phase "
          f"({machine()})")
    r = await run(calls, clients, window)
    q, w = r["quiet"], r["watched"]
    print(f"{'phase':16} {'appends':>8} {'p50 ms':>8} {'p99 ms':>8} {'list ms':>8}")
    print(f"{'no clients':16} {q['appends']:8} {q['p50_ms']:8.2f} {q['p99_ms']:8.2f} "
          f"{q['list_ms']:8.1f}")
    print(f"{f'{clients} clients':16} {w['appends']:8} {w['p50_ms']:8.2f} {w['p99_ms']:8.2f} "
          f"{r['list_ms_clients']:8.1f}")
    print(f"bots' appends with clients / without: p50 x{w['p50_ms'] / q['p50_ms']:.2f}, "
          f"p99 x{w['p99_ms'] / q['p99_ms']:.2f}")
    print(f"viewer's PostgreSQL connections: {r['viewer_connections_idle']} idle, "
          f"{r['viewer_connections_clients']} with {clients} clients")
    c = r["clients"]
    print(f"clients: {c.get('opened')} opened, {c.get('updates')} updates, "
          f"{c.get('errors')} errors" + (f" (first: {c['first_error']})"
                                          if c.get("first_error") else ""))
    return 1 if c.get("opened") != clients or c.get("errors") else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
