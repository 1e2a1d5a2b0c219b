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
from alembic.autogenerate import compare_metadata
from alembic.util import CommandError
from sqlalchemy import inspect, pool
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from ..errors import SchemaMismatch, SessionStoreError, StoreUnavailable, driver_said, refused
from .schema import check_known_revisions, metadata, on_dialect, streams, unrecorded_revision

ALEMBIC_INI = Path(__file__).resolve().parents[2] / "alembic.ini"
# Where an installed wheel carries the migrations (pyproject's force-include): no alembic.ini
# there, so the configuration is built here.
PACKAGED_MIGRATIONS = Path(__file__).resolve().parents[1] / "_migrations"


def alembic_config(url: str, schema: str | None = None) -> Config:
    if ALEMBIC_INI.exists():  # a checkout (also an editable install): its alembic.ini
        cfg = Config(str(ALEMBIC_INI))
    elif (PACKAGED_MIGRATIONS / "env.py").exists():
        cfg = Config()
        cfg.set_main_option("script_location", str(PACKAGED_MIGRATIONS))
    else:
        raise FileNotFoundError(f"no migrations: neither {ALEMBIC_INI} nor "
                                f"{PACKAGED_MIGRATIONS} exists (a broken install?)")
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
    from . import check_url

    if check_url(url) == "sqlite+aiosqlite":  # (a URL that cannot be parsed: ValueError)
        from .sqlite.files import check_database_file, check_writable, database_path

        path = database_path(url)  # (in memory: ValueError, nothing would persist)
        check_database_file(path, creating=True)
        check_writable(path)
    if schema:
        from .postgres.dialect import check_schema_name

        check_schema_name(schema)  # the same rule as the store's
    cfg = alembic_config(url, schema)
    connect_args = {"server_settings": {"search_path": schema}} if schema else {}
    engine = create_async_engine(url, poolclass=pool.NullPool, connect_args=connect_args)
    try:
        async with engine.begin() as conn:
            def migrate(sync_conn) -> None:
                # Before Alembic looks for the stored revision in its scripts (and fails
                # with "Can't locate revision"): say it as the store does.
                heads = MigrationContext.configure(sync_conn).get_current_heads()
                check_known_revisions(heads)
                if not heads and inspect(sync_conn).has_table(streams.name):
                    # Tables and no revision (alembic_version emptied or dropped): the first
                    # migration would fail on "table already exists", after nothing.
                    raise SchemaMismatch(unrecorded_revision(_matches_this_code(sync_conn)))
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


def _matches_this_code(sync_conn) -> bool:
    """Are the database's tables exactly this code's schema (Alembic's comparison)?"""
    context = MigrationContext.configure(sync_conn, opts={
        "compare_type": True, "include_object": on_dialect(sync_conn.dialect.name)})
    return not compare_metadata(context, metadata)


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
