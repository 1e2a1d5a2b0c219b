"""Alembic environment: async engines for both dialects, optional PostgreSQL schema.

URL: `-x url=...`, else $SESSION_STORE_URL, else alembic.ini. `-x schema=NAME` (or the
`schema` config attribute) migrates inside that PostgreSQL schema (tests isolate that way).
A caller may hand over an open sync connection as `config.attributes["connection"]`.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from alembic.util import CommandError
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import create_async_engine

from session_store.storage.schema import metadata, on_dialect

config = context.config
x_args = context.get_x_argument(as_dictionary=True)


def _url() -> str:
    given = x_args.get("url") or config.attributes.get("url")
    if given:
        return given
    env = os.environ.get("SESSION_STORE_URL")
    if env is not None and not env.strip():
        # (Set to nothing is a mistake: falling back to alembic.ini's database would migrate
        # another database than the one meant.)
        raise CommandError("$SESSION_STORE_URL is empty: give a database URL "
                           "(or unset it for alembic.ini's sqlalchemy.url)")
    return env or config.get_main_option("sqlalchemy.url")


def _schema() -> str | None:
    return x_args.get("schema") or config.attributes.get("schema")


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=metadata,
                      render_as_batch=connection.dialect.name == "sqlite",
                      include_object=on_dialect(connection.dialect.name))
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    url = _url()
    connect_args = {}
    if _schema():
        connect_args["server_settings"] = {"search_path": _schema()}
    engine = create_async_engine(url, poolclass=pool.NullPool, connect_args=connect_args)
    async with engine.connect() as conn:
        await conn.run_sync(_run)
        await conn.commit()
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif config.attributes.get("connection") is not None:
    _run(config.attributes["connection"])
else:
    asyncio.run(_run_async())
