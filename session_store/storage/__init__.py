"""The event log's storage: one SQLAlchemy Core store (store.py, reads.py, group_commit.py,
heads.py, batch.py) given a dialect (dialect.py): a package per database (sqlite/,
postgres/), each a committer and its statements."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .urls import SQLALCHEMY_ONLY_OPTIONS, URL_HINT, check_url

if TYPE_CHECKING:
    from .store import SqlEventStore

# Imported on first use (PEP 562), as the package's names: the SQLite writer process imports
# `storage.batch` and `storage.sqlite.commit` only, without SQLAlchemy.
_MODULE_OF = {"SqlEventStore": ".store", "Snapshot": ".reads", "StreamHead": ".reads"}


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
    if check_url(url) == "sqlite+aiosqlite":
        from .sqlite.dialect import sqlite_store as unopened
    else:
        from .postgres.dialect import postgres_store as unopened
    store = unopened(url, **options)
    await store._open()
    return store


__all__ = ["URL_HINT", "SQLALCHEMY_ONLY_OPTIONS", "check_url", "open_store", "SqlEventStore",
           "Snapshot", "StreamHead"]
