"""The `flavour` fixture: each wire scenario runs our service on SQLite and on PostgreSQL
(the same databases as the shared `store` fixture: a fresh file, or a fresh schema) and
pipecat's stock GeminiLiveLLMService once (no store: the log assertions are ours only).

A scenario marked `@pytest.mark.stock_bug("...")` is expected to fail on the stock service
(strict xfail: it shows the test can fail, and if upstream fixes the bug the run says so).
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from tests.conftest import PG_DSN, PG_URL, Backend

from .helpers import Flavour


def pytest_configure(config):
    config.addinivalue_line("markers", "stock_bug(reason): the stock GeminiLiveLLMService "
                                       "fails this scenario because of that upstream bug")
    config.addinivalue_line("markers", "slow: a scenario that takes several seconds of wall "
                                       "time by design (still run in CI)")


@pytest.fixture(params=["sqlite", "postgres", "stock"])
def flavour_name(request):
    if request.param == "stock":
        marker = request.node.get_closest_marker("stock_bug")
        if marker is not None:
            request.applymarker(pytest.mark.xfail(
                strict=True, reason=f"upstream bug: {marker.args[0]}"))
    return request.param


@pytest.fixture
async def flavour(flavour_name, tmp_path):
    if flavour_name == "stock":
        yield Flavour("stock")
        return
    schema = None
    if flavour_name == "sqlite":
        backend = Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'log.db'}")
    else:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f"CREATE SCHEMA {schema}")
        finally:
            await conn.close()
        backend = Backend("postgres", PG_URL, {"schema": schema})
    try:
        await backend.migrate()
        store = await backend.open()
        try:
            yield Flavour(flavour_name, store)
        finally:
            await store.close()
    finally:
        if schema is not None:
            conn = await asyncpg.connect(PG_DSN)
            try:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            finally:
                await conn.close()
