"""Run Alembic programmatically (the CLI's `migrate`, tests, the demo).

Alembic's commands are synchronous; they run here on a sync facade of one async connection
(`run_sync`), handed to migrations/env.py as `config.attributes["connection"]`: no second
event loop, no thread.
"""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import create_async_engine

ALEMBIC_INI = Path(__file__).resolve().parent.parent / "alembic.ini"


def alembic_config(url: str, schema: str | None = None) -> Config:
    if not ALEMBIC_INI.exists():
        raise FileNotFoundError(f"{ALEMBIC_INI} not found: install the project from its checkout "
                                "(pip install -e .) so the migrations are available")
    cfg = Config(str(ALEMBIC_INI))
    cfg.attributes["url"] = url
    if schema:
        cfg.attributes["schema"] = schema
    return cfg


# Alembic commands install module-level proxies (alembic.context, alembic.op): two running at
# once in one process corrupt each other. One at a time per event loop.
_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def _run(url: str, schema: str | None, fn, revision: str) -> None:
    lock = _locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock:
        await _run_locked(url, schema, fn, revision)


async def _run_locked(url: str, schema: str | None, fn, revision: str) -> None:
    if schema:
        from .storage.postgres import check_schema_name

        check_schema_name(schema)  # the same rule as the store's
    connect_args = {"server_settings": {"search_path": schema}} if schema else {}
    engine = create_async_engine(url, poolclass=pool.NullPool, connect_args=connect_args)
    try:
        async with engine.begin() as conn:
            def migrate(sync_conn) -> None:
                cfg = alembic_config(url, schema)
                cfg.attributes["connection"] = sync_conn
                fn(cfg, revision)

            await conn.run_sync(migrate)
    finally:
        await engine.dispose()


async def upgrade(url: str, revision: str = "head", *, schema: str | None = None) -> None:
    await _run(url, schema, command.upgrade, revision)


async def downgrade(url: str, revision: str = "base", *, schema: str | None = None) -> None:
    await _run(url, schema, command.downgrade, revision)
