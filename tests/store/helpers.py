"""Shared helpers of the session_store contract suite (no fixtures here; see conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from session_store import events as ev
from session_store.events import Event, canonical_json
from session_store.records import GENESIS_HASH, RecordedEvent, chain_hash

T0_US = 1_750_000_000_000_000  # a fixed "now" for hand-built streams


def opened(worker: str = "w1", epoch: int = 1) -> ev.SessionOpened:
    return ev.SessionOpened(model="gemini-live", tools=["lookup", "book"], worker=worker,
                            epoch=epoch)


def msg(i: int, role: str = "user") -> ev.ConversationMessage:
    return ev.ConversationMessage(role=role, text=f"turn {i}")


def record(stream_id: str, events: Sequence[Event], *, start_version: int = 1,
           start_position: int | None = None, t0_us: int = T0_US, step_us: int = 1000,
           prev_hash: str = GENESIS_HASH,
           recorded_at_us: Sequence[int] | None = None) -> list[RecordedEvent]:
    """Hand-built RecordedEvents with versions start_version.. and a valid hash chain."""
    out, h = [], prev_hash
    for i, e in enumerate(events):
        version = start_version + i
        at = recorded_at_us[i] if recorded_at_us is not None else t0_us + step_us * (version - 1)
        data_json = canonical_json(e.to_data())
        h = chain_hash(h, stream_id, version, e.TYPE, e.SCHEMA, at, data_json)
        position = (start_position if start_position is not None else 1000) + i
        out.append(RecordedEvent(stream_id, version, position, e.TYPE, e.SCHEMA, data_json, at, h))
    return out


def raw_record(stream_id: str, version: int, etype: str, schema_version: int, data_json: str,
               *, prev_hash: str = GENESIS_HASH, at_us: int = T0_US,
               position: int = 1) -> RecordedEvent:
    """A RecordedEvent with arbitrary stored parts (type, schema, JSON) and a valid hash."""
    h = chain_hash(prev_hash, stream_id, version, etype, schema_version, at_us, data_json)
    return RecordedEvent(stream_id, version, position, etype, schema_version, data_json, at_us, h)


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


class Log:
    """A hand-built stream: add events (each gets the next version and a time), fold it."""

    def __init__(self, stream_id: str = "call-1", t0_us: int = T0_US, step_us: int = 1000):
        self.stream_id, self.step_us, self._next_at = stream_id, step_us, t0_us
        self.events: list[Event] = []
        self.times: list[int] = []

    @property
    def version(self) -> int:
        return len(self.events)

    @property
    def now_us(self) -> int:
        """The time of the last event."""
        return self.times[-1] if self.times else self._next_at

    def add(self, *events: Event, at_us: int | None = None) -> int:
        """Append events (at `at_us`, else one step after the previous); returns the version."""
        if at_us is not None:
            self._next_at = at_us
        for e in events:
            self.events.append(e)
            self.times.append(self._next_at)
            self._next_at += self.step_us
        return self.version

    def records(self, start: int = 1) -> list[RecordedEvent]:
        recs = record(self.stream_id, self.events, recorded_at_us=self.times)
        return recs[start - 1:]

    def state(self):
        from session_store.projection import fold
        return fold(self.records())
