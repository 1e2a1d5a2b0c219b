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
    """Events after `after` as they commit (the store's subscribe), of one call or all. For
    one call, versions come out in order, each once: one missing from what the subscription
    gave (it started from a position `read` returned) is read from the call itself."""
    last = after.version if after is not None and call_id is not None else 0
    async for rec in store.subscribe(after.position if after is not None else 0,
                                     stream_id=call_id):
        if call_id is None:
            yield rec
            continue
        if rec.version <= last:
            continue
        if rec.version > last + 1:
            for gap in await store.read(call_id, from_version=last + 1,
                                        to_version=rec.version - 1):
                yield gap
        last = rec.version
        yield rec


async def log_end(store) -> RecordedEvent | None:
    """The newest event of the whole log (None: empty): where `tail --from-now` starts."""
    rows = await last_records(store, 1)
    return rows[-1] if rows else None
