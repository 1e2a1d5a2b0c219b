"""The viewer during a PostgreSQL outage: every page answers within 5 s, 503 with what is
wrong, and the viewer serves again once the database is back.

Before, a partition hung each page until the read timeout (32 s) and then answered a bare
500. Two outages: the network to the database goes silent (tests/faults/netproxy.py: nothing
closes, nothing answers), and the server stops (connections refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from sqlalchemy.engine import make_url

from session_store import events as ev

from ..conftest import Backend
from ..tools.conftest import running_viewer, viewer_client
from .netproxy import PartitionProxy

pytestmark = pytest.mark.timeout(180)

PAGES = ["/", "/api/calls", "/fleet", "/calls/c1", "/api/state/c1", "/api/timeline/c1",
         "/export/c1", "/api/replay/c1"]


async def answers_in_time(base: str, expect: str) -> None:
    """Each page: 503 within 5 s, saying `expect` (and no traceback)."""
    async with viewer_client(base, timeout=30) as http:
        for page in PAGES:
            t = time.monotonic()
            r = await http.get(page)
            took = time.monotonic() - t
            assert r.status_code == 503, (page, r.status_code, r.text[:300])
            assert took < 5.0, f"{page} took {took:.1f} s"
            assert expect in r.text and "Traceback" not in r.text, (page, r.text[:300])


async def serves_again(base: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    async with viewer_client(base, timeout=10) as http:
        for page in PAGES:
            while (r := await http.get(page)).status_code != 200:
                assert time.monotonic() < deadline, (page, r.status_code, r.text[:300])
                await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def viewer_on(url: str, schema: str):
    """The viewer (tests/tools/conftest.py), started and stopped off this event loop, which
    runs the proxy the viewer connects through."""
    viewer = running_viewer(Backend("postgres", url, {"schema": schema}))
    base = await asyncio.to_thread(viewer.__enter__)
    try:
        yield base
    finally:
        await asyncio.to_thread(viewer.__exit__, None, None, None)


async def write_c1(store) -> None:
    await store.append("c1", [ev.SessionOpened("m", [], "w", 1, {}),
                              ev.ConversationMessage("user", "hello", 1)], 0)


async def test_a_silent_network_gives_503_within_5_s(private_pg, pg_store_factory):
    store = await pg_store_factory()
    await write_c1(store)
    upstream = make_url(private_pg.url)
    proxy = await PartitionProxy(upstream.host, upstream.port).start()
    try:
        url = upstream.set(port=proxy.port).render_as_string(hide_password=False)
        schema = store._dialect._schema
        async with viewer_on(url, schema) as base:
            await serves_again(base, within=5)
            proxy.partition()
            await answers_in_time(base, "does not answer")
            proxy.heal()
            await serves_again(base)
    finally:
        proxy.heal()
        await proxy.close()


async def test_a_stopped_server_gives_503_at_once(private_pg, pg_store_factory):
    store = await pg_store_factory()
    await write_c1(store)
    schema = store._dialect._schema
    async with viewer_on(private_pg.url, schema) as base:
        await serves_again(base, within=5)
        await asyncio.to_thread(private_pg.stop, "fast")
        try:
            await answers_in_time(base, "cannot reach the database")
        finally:
            await asyncio.to_thread(private_pg.start)
        await serves_again(base)
