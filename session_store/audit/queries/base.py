"""What the queries share: the store's engine, the event columns, a payload as a dict."""

from __future__ import annotations

import json

from sqlalchemy.ext.asyncio import AsyncEngine

from ...storage.schema import events

EVENT_COLUMNS = (events.c.stream_id, events.c.version, events.c.position, events.c.type,
                 events.c.schema_version, events.c.data, events.c.recorded_at_us,
                 events.c.hash)
#: Rows a call-set scan reads per statement.
SCAN_CHUNK = 2000


def engine_of(store) -> AsyncEngine:
    """The store's engine (read-only use)."""
    engine = getattr(store, "engine", None)
    return engine if isinstance(engine, AsyncEngine) else store._engine


def payload_dict(text: str) -> dict:
    """A stored payload as a dict ({} for a row that is not one: shown elsewhere)."""
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return d if isinstance(d, dict) else {}
