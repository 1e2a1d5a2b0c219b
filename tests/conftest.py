"""Shared fixtures: every storage test runs on SQLite and on PostgreSQL.

PostgreSQL: 127.0.0.1:5432, user postgres, database `test` (override with
SESSION_STORE_TEST_PG). Each test gets its own schema, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

import asyncpg
import pytest

from session_store import open_store
from session_store.migrate import upgrade

PG_URL = os.environ.get("SESSION_STORE_TEST_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PG_DSN = PG_URL.replace("postgresql+asyncpg", "postgresql")


@dataclass
class Backend:
    """Where a test's log lives: a URL plus the options that isolate it."""
    name: str
    url: str
    options: dict = field(default_factory=dict)

    async def migrate(self) -> None:
        await upgrade(self.url, schema=self.options.get("schema"))

    async def open(self, **extra):
        return await open_store(self.url, **self.options, **extra)

    @property
    def cli_args(self) -> list[str]:
        args = ["--db", self.url]
        if "schema" in self.options:
            args += ["--schema", self.options["schema"]]
        return args


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request, tmp_path):
    """An empty, unmigrated database on each backend."""
    if request.param == "sqlite":
        yield Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'log.db'}")
        return
    schema = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
        yield Backend("postgres", PG_URL, {"schema": schema})
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


@pytest.fixture
async def migrated(backend):
    await backend.migrate()
    return backend


@pytest.fixture
async def store(migrated):
    s = await migrated.open()
    try:
        yield s
    finally:
        await s.close()
