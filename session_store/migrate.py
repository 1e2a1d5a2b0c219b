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
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError
from sqlalchemy import pool
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from .errors import SchemaMismatch, SessionStoreError, StoreUnavailable, driver_said, refused
from .schema import check_known_revisions

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
    from .storage import check_url

    check_url(url)  # a URL that cannot be parsed or names another driver: ValueError
    if schema:
        from .storage.postgres import check_schema_name

        check_schema_name(schema)  # the same rule as the store's
    cfg = alembic_config(url, schema)
    connect_args = {"server_settings": {"search_path": schema}} if schema else {}
    engine = create_async_engine(url, poolclass=pool.NullPool, connect_args=connect_args)
    try:
        async with engine.begin() as conn:
            def migrate(sync_conn) -> None:
                # Before Alembic looks for the stored revision in its scripts (and fails
                # with "Can't locate revision"): say it as the store does.
                check_known_revisions(MigrationContext.configure(sync_conn).get_current_heads())
                cfg.attributes["connection"] = sync_conn
                fn(cfg, revision)

            await conn.run_sync(migrate)
    except (OSError, DBAPIError) as exc:
        if engine.dialect.name == "sqlite":
            # aiosqlite stops the thread of a connection that failed to open without waiting
            # for it: let it end while this loop still runs, or it fails on the closed loop
            # and prints a traceback after the one-line error.
            await asyncio.sleep(0.05)
        raise _unusable(exc) from exc
    except CommandError as exc:  # (its messages name revisions, never the URL)
        raise SchemaMismatch(f"cannot migrate the schema: {exc}") from exc
    finally:
        await engine.dispose()


def _unusable(exc: OSError | DBAPIError) -> SessionStoreError:
    """The store's error for a database migrate cannot use, as `open_store` words it: an
    outage (refused, unreachable, a file that cannot be opened) or a refusal (no such
    database or role, a login refused, a file that is not SQLite). It says what the
    driver said, never the URL: it may hold a password."""
    if isinstance(exc, (OSError, OperationalError, InterfaceError)):
        cause = getattr(exc, "orig", None) or exc
        return StoreUnavailable(f"cannot reach the database ({type(cause).__name__}: "
                                f"{driver_said(exc)})")
    return refused(exc)


async def upgrade(url: str, revision: str = "head", *, schema: str | None = None) -> None:
    await _run(url, schema, command.upgrade, revision)


async def downgrade(url: str, revision: str = "base", *, schema: str | None = None) -> None:
    await _run(url, schema, command.downgrade, revision)
