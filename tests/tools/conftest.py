"""Fixtures of the support-tooling tests: a live viewer (uvicorn in a thread) and raw SQL."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from session_store.web import create_app

from .helpers import HOUR_US, T0, failing_call, support_call, write_call

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "tools"


@contextlib.contextmanager
def running_viewer(backend, **options):
    """`session-store serve` in a background thread on 127.0.0.1 and a free port."""
    app = create_app(backend.url, schema=backend.options.get("schema"), **options)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, name="viewer", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the viewer did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


# These tests are about what the viewer answers, not how fast: on a starved machine (load 25)
# a cold viewer's first page took longer than httpx's default 5 s read timeout.
VIEWER_TIMEOUT_S = 60.0


def viewer_client(base: str, **options) -> httpx.AsyncClient:
    """An HTTP client for a running viewer, with a timeout that only a hung viewer meets."""
    options.setdefault("timeout", VIEWER_TIMEOUT_S)
    return httpx.AsyncClient(base_url=base, **options)


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


async def sql(backend, statement: str, **params) -> list[tuple]:
    """One statement straight on the database (tampering, inspection), bound parameters."""
    connect_args = {}
    if backend.name == "postgres":
        connect_args["server_settings"] = {"search_path": backend.options["schema"]}
    engine = create_async_engine(backend.url, poolclass=pool.NullPool, connect_args=connect_args)
    try:
        async with engine.begin() as conn:
            result = await conn.execute(text(statement), params)
            return [tuple(r) for r in result] if result.returns_rows else []
    finally:
        await engine.dispose()


@pytest.fixture
async def loaded(migrated):
    """Three calls: support-1 (closed), failing-1 (open but silent for days: stale), live-1."""
    await write_call(migrated, "support-1", support_call(), T0)
    await write_call(migrated, "failing-1", failing_call(), T0 + HOUR_US)
    live_t0 = (time.time_ns() // 1000) - 2_000_000
    await write_call(migrated, "live-1", failing_call()[:2], live_t0)
    migrated.live_t0 = live_t0
    return migrated
