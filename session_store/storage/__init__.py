"""Storage backends of the event log: one SQLAlchemy Core implementation, two dialects."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import SqlEventStore

# Imported on first use (PEP 562), as the package's names: the SQLite writer process imports
# `storage.batch` and `storage.sqlite_commit` only, without SQLAlchemy.
_MODULE_OF = {"SqlEventStore": ".base", "Snapshot": ".base", "StreamHead": ".base",
              "StreamReport": ".verify"}


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


async def open_store(url: str, **options) -> SqlEventStore:
    """Open the log at `url` (sqlite+aiosqlite:///file.db or postgresql+asyncpg://…).

    Checks the schema is exactly the revision this code runs on (else SchemaMismatch saying
    what to run) and starts the group-commit writers. Options: `schema` (PostgreSQL search
    path), `writers`, `max_batch_events`, `append_timeout` (seconds an append may wait for an
    unreachable database before StoreUnavailable); PostgreSQL also `attempt_timeout` (seconds
    a connect or commit may go unanswered before it is abandoned and retried, default 5) and
    `read_timeout` (the same for a read, default 30); SQLite `inline`, `inline_budget`.
    """
    from sqlalchemy.engine import make_url

    driver = make_url(url).drivername
    if driver == "sqlite+aiosqlite":
        from .sqlite import SqliteEventStore
        store: SqlEventStore = SqliteEventStore(url, **options)
    elif driver == "postgresql+asyncpg":
        from .postgres import PostgresEventStore
        store = PostgresEventStore(url, **options)
    else:
        raise ValueError(f"unsupported database URL driver {driver!r}: use sqlite+aiosqlite:///"
                         "path.db or postgresql+asyncpg://user@host/db")
    try:
        await store._start()
    except BaseException:
        await store._close_dialect()
        await store._engine.dispose()
        raise
    return store


__all__ = ["open_store", "SqlEventStore", "Snapshot", "StreamHead", "StreamReport"]
