"""Followers through a PostgreSQL restart: `subscribe()` and `session-store tail`.

Appends ride out an outage inside the store (test_db_outage.py). A follower is woken by
NOTIFY on a connection of its own, which dies with the server; nothing told the follower,
which then found other processes' commits by polling only, for good. And `tail` gave up at
the first read the database did not answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from session_store import StoreUnavailable
from session_store.events import BotStartedSpeaking

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


async def _until(check, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what} within {timeout}s"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def test_follower_listens_again_after_postgres_restarts(private_pg, pg_store_factory):
    follower = await pg_store_factory()
    follower.poll_interval = 60.0  # within seconds, only a notification can deliver
    writer = await pg_store_factory()  # another store: its commits reach the follower by NOTIFY
    got, outages = [], []

    async def follow() -> None:
        position = 0
        while True:  # as a caller should: follow again from the last event it got
            try:
                async for rec in follower.subscribe(position):
                    position = rec.position
                    got.append(rec.version)
            except StoreUnavailable as exc:
                outages.append(exc)
                await asyncio.sleep(0.2)

    task = asyncio.create_task(follow())
    try:
        v = await writer.append("call", [BotStartedSpeaking(generation=1)], 0)
        await _until(lambda: got == [1], 10, "the first event was not delivered")
        await private_pg.restart("fast", 1.0)
        for _ in range(3):
            v = await writer.append("call", [BotStartedSpeaking(generation=v + 1)], v)
            took = await _until(lambda: got[-1:] == [v], 5,
                                f"v{v}, committed after the restart, was not delivered")
            assert took < 2.0, f"v{v} took {took:.2f}s: polled, not notified"
        assert got == list(range(1, v + 1))  # nothing skipped, nothing twice
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_tail_follows_through_a_postgres_restart(private_pg):
    """`session-store tail` in its own process: it says the database went away, and shows
    what was committed after, exactly once, without being restarted."""
    schema = "tail_" + os.urandom(4).hex()

    async def setup():
        await private_pg.create_schema(schema)
        from session_store.storage.migrate import upgrade
        await upgrade(private_pg.url, schema=schema)

    async def append(v: int) -> int:
        from session_store import open_store
        store = await open_store(private_pg.url, schema=schema)
        try:
            return await store.append("tailed", [BotStartedSpeaking(generation=v + 1)], v)
        finally:
            await store.close()

    asyncio.run(setup())
    asyncio.run(append(0))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "from session_store.commands.cli import main; main()",
                             "tail", "--json", "--db", private_pg.url, "--schema", schema],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    lines: queue.Queue[str] = queue.Queue()
    said: list[str] = []
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    threading.Thread(target=lambda: [said.append(x) for x in proc.stderr], daemon=True).start()
    try:
        assert json.loads(lines.get(timeout=20))["version"] == 1
        asyncio.run(private_pg.restart("fast", 1.5))
        v = 1
        for _ in range(2):
            v = asyncio.run(append(v))
            assert json.loads(lines.get(timeout=20))["version"] == v, "".join(said)
        assert proc.poll() is None, f"tail ended: {''.join(said)}"
        assert lines.empty()
        assert any("following again when it answers" in x for x in said), said
        assert any("answers again" in x for x in said), said
    finally:
        proc.terminate()
        proc.wait(10)
