"""Storage backends of the event log: one SQLAlchemy Core implementation, two dialects."""

from __future__ import annotations

from sqlalchemy.engine import make_url

from .base import Snapshot, SqlEventStore, StreamHead
from .verify import StreamReport


async def open_store(url: str, **options) -> SqlEventStore:
    """Open the log at `url` (sqlite+aiosqlite:///file.db or postgresql+asyncpg://…).

    Checks the schema is exactly the revision this code runs on (else SchemaMismatch saying
    what to run) and starts the group-commit writers. Options: `schema` (PostgreSQL search
    path), `writers`, `max_batch_events`, `append_timeout` (seconds an append may wait for an
    unreachable database before StoreUnavailable).
    """
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
