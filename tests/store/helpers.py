"""Helpers of the database tests: the store's tables reached directly, outside the store
(no fixtures here; see conftest.py). The hand-built events and streams are tests/core's,
named here too for the suites that import them from here."""

from __future__ import annotations

import contextlib
from typing import Any

from sqlalchemy import pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from session_store.records import GENESIS_HASH, RecordedEvent

from ..core.helpers import T0_US, Log, msg, opened, raw_record, record

__all__ = ["T0_US", "Log", "msg", "opened", "raw_record", "record", "raw_db", "sql",
           "insert_raw_event"]


@contextlib.asynccontextmanager
async def raw_db(backend):
    """A plain SQLAlchemy async connection to the backend's database, outside the store
    (the test's own PostgreSQL schema on the search path). Commits on exit."""
    connect_args: dict[str, Any] = {}
    if backend.name == "postgres":
        connect_args["server_settings"] = {"search_path": backend.options["schema"]}
    engine = create_async_engine(backend.url, poolclass=pool.NullPool, connect_args=connect_args)
    try:
        async with engine.begin() as conn:
            yield conn
    finally:
        await engine.dispose()


async def sql(backend, statement: str, **params) -> list[tuple]:
    """Run one statement directly on the database (tampering, fixtures, inspection)."""
    async with raw_db(backend) as conn:
        result = await conn.execute(text(statement), params)
        return [tuple(r) for r in result] if result.returns_rows else []


async def insert_raw_event(backend, stream_id: str, etype: str, schema_version: int,
                           data_json: str, *, at_us: int = T0_US) -> RecordedEvent:
    """Write one event row by hand, as older or newer code (or a broken disk) might have,
    with a valid hash chain and head row, appended after the stream's current head."""
    async with raw_db(backend) as conn:
        head = (await conn.execute(
            text("SELECT version, last_hash FROM session_streams WHERE stream_id = :s"),
            {"s": stream_id})).first()
        version, prev = (head[0] + 1, head[1]) if head else (1, GENESIS_HASH)
        rec = raw_record(stream_id, version, etype, schema_version, data_json,
                         prev_hash=prev, at_us=at_us)
        await conn.execute(text(
            "INSERT INTO session_events (tx_order, stream_id, version, type, schema_version, "
            "data, recorded_at_us, hash) VALUES (0, :s, :v, :t, :sv, :d, :at, :h)"),
            {"s": stream_id, "v": version, "t": etype, "sv": schema_version, "d": data_json,
             "at": at_us, "h": rec.hash})
        if head:
            await conn.execute(text("UPDATE session_streams SET version = :v, last_hash = :h "
                                    "WHERE stream_id = :s"),
                               {"s": stream_id, "v": version, "h": rec.hash})
        else:
            await conn.execute(text(
                "INSERT INTO session_streams (stream_id, version, last_hash, epoch, "
                "created_at_us, updated_at_us) VALUES (:s, :v, :h, 0, :at, :at)"),
                {"s": stream_id, "v": version, "h": rec.hash, "at": at_us})
    return rec
