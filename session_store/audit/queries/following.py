"""Following the log as it grows: the newest events, then each one as it commits (`tail`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from sqlalchemy import select

from ...records import RecordedEvent
from .base import EVENT_COLUMNS, engine_of


async def last_records(store, n: int, call_id: str | None = None) -> list[RecordedEvent]:
    """The newest `n` events (of one call, or of the whole log in its global order)."""
    if call_id is not None:
        head = await store.stream_version(call_id)
        return await store.read(call_id, from_version=max(head - n + 1, 1)) if head else []
    order = store._dialect.global_order()
    async with engine_of(store).connect() as conn:
        rows = (await conn.execute(select(*EVENT_COLUMNS).order_by(*(c.desc() for c in order))
                                   .limit(n))).all()
    return [RecordedEvent(*r) for r in reversed(rows)]


async def follow(store, after: RecordedEvent | None, call_id: str | None = None
                 ) -> AsyncIterator[RecordedEvent]:
    """Events after `after` as they commit (the store's subscribe), of one call (read from
    the call's own events, each version once, in order) or all."""
    if call_id is None:
        async for rec in store.subscribe(after.position if after is not None else 0):
            yield rec
        return
    async for rec in store.subscribe(stream_id=call_id,
                                     after_version=after.version if after is not None else 0):
        yield rec


async def log_end(store) -> RecordedEvent | None:
    """The newest event of the whole log (None: empty): where `tail --from-now` starts."""
    rows = await last_records(store, 1)
    return rows[-1] if rows else None
