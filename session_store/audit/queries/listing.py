"""The call list: pages of calls, filtered and sorted, their counts and summaries.

Listings never fold calls: a page of stream heads comes from `session_streams`, its counts
from one GROUP BY over that page's events (the (stream_id, version) index), so a listing
in start order (the default) costs the same with 100 or 100,000 calls: heads are read through
their start-time index (bench/listing.py). Counts and id searches read every head, by nature.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from sqlalchemy import and_, exists, func, not_, or_, select

from ...storage.schema import events, streams, valid_id, valid_stream_id
from ..summaries import (
    COUNTED_TYPES, SORTS, STALE_AFTER_US, TOOL_END_TYPES, CallFilter, CallSummary, like_pattern,
    summarise, tool_ends,
)
from ..timeline import LETTING_GO, PLANNED_REASONS
from .base import SCAN_CHUNK, engine_of, payload_dict


_HEAD = (streams.c.stream_id, streams.c.version, streams.c.epoch, streams.c.created_at_us,
         streams.c.updated_at_us)


def _closed():
    return exists().where(events.c.stream_id == streams.c.stream_id,
                          events.c.type == "session.closed")


def _has(*types: str):
    return exists().where(events.c.stream_id == streams.c.stream_id, events.c.type.in_(types))


def _sort_key(name: str):
    key, desc = SORTS[name]
    column = {"start": streams.c.created_at_us, "last_event": streams.c.updated_at_us,
              "events": streams.c.version,
              "duration": streams.c.updated_at_us - streams.c.created_at_us}[key]
    return column, desc


def _where(flt: CallFilter, now_us: int, stale_after_us: int) -> list:
    conds = []
    if flt.since_us is not None:
        conds.append(streams.c.created_at_us >= flt.since_us)
    if flt.until_us is not None:
        conds.append(streams.c.created_at_us < flt.until_us)
    if flt.search:
        conds.append(streams.c.stream_id.like(like_pattern(flt.search), escape="\\"))
        # SQLite's LIKE ignores the case of ASCII letters (PostgreSQL's does not): "support"
        # would list "Support-1" on one database only. replace() is case-sensitive on both,
        # and removes something only from an id that contains the text.
        conds.append(func.replace(streams.c.stream_id, flt.search, "") != streams.c.stream_id)
    recent = streams.c.updated_at_us >= now_us - stale_after_us
    if flt.status == "closed":
        conds.append(_closed())
    elif flt.status == "open":
        conds.append(and_(not_(_closed()), recent))
    elif flt.status == "stale":
        conds.append(and_(not_(_closed()), not_(recent)))
    if flt.failed:
        conds.append(_has("tool.call_failed"))
    if flt.takeover:
        conds.append(_has("session.worker_attached"))
    if flt.anomaly:
        conds.append(_has("anomaly.recorded"))
    duration = streams.c.updated_at_us - streams.c.created_at_us
    if flt.min_duration_s is not None:
        conds.append(duration >= int(flt.min_duration_s * 1e6))
    if flt.max_duration_s is not None:
        conds.append(duration <= int(flt.max_duration_s * 1e6))
    return conds


@dataclass
class CallPage:
    calls: list[CallSummary]
    next_after: str | None  # pass as `after` for the next page; None on the last page

    def to_json(self) -> dict:
        from ..models import CallPage as Model, dump

        return dump(Model, {"calls": [c.to_json() for c in self.calls],
                            "next_after": self.next_after})


async def _counts(conn, ids: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {i: {} for i in ids}
    if not ids:
        return out
    stmt = (select(events.c.stream_id, events.c.type, func.count())
            .where(events.c.stream_id.in_(ids), events.c.type.in_(list(COUNTED_TYPES)))
            .group_by(events.c.stream_id, events.c.type))
    for sid, etype, n in await conn.execute(stmt):
        out[sid][etype] = n
    return out


def is_planned(attach_data: dict, previous_type: str | None, previous_data: dict) -> bool:
    """A takeover the old worker made way for (a deploy), not one after it died."""
    return (attach_data.get("reason") in PLANNED_REASONS
            or (previous_type == "connection.disconnected"
                and previous_data.get("reason") in LETTING_GO))


async def _handovers(conn, ids) -> dict[str, int]:
    """Planned hand-overs per call among its takeovers: each attach and the event before it.
    `ids`: a list of call ids, or a subquery selecting them."""
    prev = events.alias("prev")
    stmt = (select(events.c.stream_id, events.c.data, prev.c.type, prev.c.data)
            .select_from(events.outerjoin(prev, and_(prev.c.stream_id == events.c.stream_id,
                                                     prev.c.version == events.c.version - 1)))
            .where(events.c.type == "session.worker_attached", events.c.stream_id.in_(ids)))
    out: dict[str, int] = {}
    for sid, data, ptype, pdata in await conn.execute(stmt):
        planned = is_planned(payload_dict(data), ptype, payload_dict(pdata) if pdata else {})
        out[sid] = out.get(sid, 0) + int(planned)
    return out


async def _summaries(conn, rows: list[tuple], now_us: int,
                     stale_after_us: int) -> list[CallSummary]:
    ids = [r[0] for r in rows]
    counts = await _counts(conn, ids)
    handovers = await _handovers(conn, ids) if any(
        counts[i].get("session.worker_attached") for i in ids) else {}
    ends = await _tool_ends(conn, [i for i in ids if counts[i].get("tool.call_failed")
                                   or counts[i].get("session.closed")])
    return [summarise(r, counts[r[0]], now_us, stale_after_us, handovers.get(r[0], 0),
                      ends.get(r[0], (0, 0)))
            for r in rows]


async def _tool_ends(conn, ids: list[str]) -> dict[str, tuple[int, int]]:
    """`tool_ends` of each call (read only for calls that ended or had a failure)."""
    if not ids:
        return {}
    rows: dict[str, list] = {}
    stmt = (select(events.c.stream_id, events.c.version, events.c.type, events.c.data)
            .where(events.c.stream_id.in_(ids), events.c.type.in_(TOOL_END_TYPES)))
    for sid, version, etype, data in await conn.execute(stmt):
        rows.setdefault(sid, []).append((version, etype, payload_dict(data)))
    return {sid: tool_ends(r) for sid, r in rows.items()}


# Types whose payload a text search reads, and the fields it looks in.
_SEARCHED = {"conversation.message": ("text",), "conversation.message_cut": ("text",),
             "tool.call_requested": ("args",),
             "tool.call_completed": ("result",), "tool.call_failed": ("error",)}


def _contains(value, needle: str) -> bool:
    """Does `needle` (lower case) occur in a JSON value's strings, keys or numbers?"""
    if isinstance(value, str):
        return needle in value.lower()
    if isinstance(value, dict):
        return any(_contains(k, needle) or _contains(v, needle) for k, v in value.items())
    if isinstance(value, list):
        return any(_contains(v, needle) for v in value)
    return value is not None and needle in json.dumps(value).lower()


async def matching_calls(conn, flt: CallFilter) -> set[str]:
    """Calls whose transcripts, tool arguments or results contain `flt.text` (any case),
    and that asked for `flt.tool`. The database narrows by type and LIKE on the stored JSON
    text; each candidate payload is then read here, so the match is exact on both databases
    and a row that is not JSON matches nothing (it is reported where the call is read)."""
    sets: list[set[str]] = []
    narrow = dataclasses.replace(CallFilter(), since_us=flt.since_us, until_us=flt.until_us,
                                 search=flt.search)
    scope = ([events.c.stream_id.in_(select(streams.c.stream_id).where(*_where(narrow, 0, 0)))]
             if narrow != CallFilter() else [])
    if flt.tool:
        found = set()
        stmt = select(events.c.stream_id, events.c.data).where(
            events.c.type == "tool.call_requested",
            events.c.data.like(like_pattern(json.dumps(flt.tool, ensure_ascii=False)),
                               escape="\\"), *scope)
        for sid, data in await conn.execute(stmt):
            if payload_dict(data).get("name") == flt.tool:
                found.add(sid)
        sets.append(found)
    if flt.text:
        needle = flt.text.lower()
        # The stored JSON escapes quotes and backslashes: narrow on the longest run of the
        # needle that JSON writes as itself.
        run = max(_plain_runs(needle), key=len, default="")
        found = set()
        conditions = [events.c.type.in_(list(_SEARCHED)), *scope]
        if run:
            conditions.append(func.lower(events.c.data).like(like_pattern(run), escape="\\"))
        stmt = select(events.c.stream_id, events.c.type, events.c.data).where(*conditions)
        for sid, etype, data in await conn.execute(stmt):
            if sid in found:
                continue
            d = payload_dict(data)
            if any(_contains(d.get(f), needle) for f in _SEARCHED[etype]):
                found.add(sid)
        sets.append(found)
    return set.intersection(*sets) if sets else set()


def _plain_runs(text: str) -> list[str]:
    """Parts of `text` that canonical JSON writes unchanged (no quote, backslash, control
    character; ASCII only, as lower() agrees on it on both databases)."""
    out: list[str] = []
    run: list[str] = []
    for ch in text:
        if ch in '"\\' or ord(ch) < 0x20 or ord(ch) > 0x7E:
            if run:
                out.append("".join(run))
            run = []
        else:
            run.append(ch)
    if run:
        out.append("".join(run))
    return out


def page_query(flt: CallFilter, now_us: int, *, stale_after_us: int = STALE_AFTER_US,
               after_key: int | None = None):
    """The statement listing the filter's heads in its order (ties by call id); `after_key`:
    the sort column's value of the call `flt.after` names, when there is one."""
    column, desc = _sort_key(flt.sort)
    order = (column.desc(), streams.c.stream_id.desc()) if desc else (column.asc(),
                                                                       streams.c.stream_id.asc())
    stmt = select(*_HEAD).where(*_where(flt, now_us, stale_after_us)).order_by(*order)
    if flt.after is not None:
        if after_key is None:
            raise ValueError("after_key: the sort value of the call `after` names is needed")
        key = after_key
        stmt = stmt.where(
            or_(column < key, and_(column == key, streams.c.stream_id < flt.after)) if desc else
            or_(column > key, and_(column == key, streams.c.stream_id > flt.after)))
    return stmt


async def list_calls(store, flt: CallFilter, now_us: int, *,
                     stale_after_us: int = STALE_AFTER_US) -> CallPage:
    """One page of calls in the filter's order (ties by call id), with their counts.
    ValueError when `after` names no call: its page would be empty, read as the end of the
    list."""
    async with engine_of(store).connect() as conn:
        key = None
        if flt.after is not None:
            if valid_stream_id(flt.after):
                key = (await conn.execute(select(_sort_key(flt.sort)[0]).where(
                    streams.c.stream_id == flt.after))).scalar()
            if key is None:
                raise ValueError(f"after: there is no call {flt.after!r} (give the last call "
                                 "id of the previous page)")
        stmt = page_query(flt, now_us, stale_after_us=stale_after_us, after_key=key)
        if flt.search is not None and not valid_id(flt.search, 10_000):
            return CallPage([], None)  # no call id holds it
        if flt.text or flt.tool:
            rows = await _page_of(conn, stmt, await matching_calls(conn, flt), flt.limit + 1)
        else:
            rows = [tuple(r) for r in await conn.execute(stmt.limit(flt.limit + 1))]
        more = len(rows) > flt.limit
        rows = rows[:flt.limit]
        calls = await _summaries(conn, rows, now_us, stale_after_us)
    return CallPage(calls, rows[-1][0] if more and rows else None)


async def _page_of(conn, stmt, wanted: set[str], n: int) -> list[tuple]:
    """The first `n` heads `stmt` lists that are in `wanted` (read in chunks)."""
    if not wanted:
        return []
    rows: list[tuple] = []
    offset = 0
    while len(rows) < n:
        chunk = [tuple(r) for r in await conn.execute(stmt.limit(SCAN_CHUNK).offset(offset))]
        rows += [r for r in chunk if r[0] in wanted]
        if len(chunk) < SCAN_CHUNK:
            break
        offset += SCAN_CHUNK
    return rows[:n]


async def count_calls(store, flt: CallFilter, now_us: int, *,
                      stale_after_us: int = STALE_AFTER_US) -> int:
    if flt.search is not None and not valid_id(flt.search, 10_000):
        return 0
    where = _where(flt, now_us, stale_after_us)
    async with engine_of(store).connect() as conn:
        if flt.text or flt.tool:
            wanted = await matching_calls(conn, flt)
            if not wanted:
                return 0
            ids = {r[0] for r in await conn.execute(select(streams.c.stream_id).where(*where))}
            return len(ids & wanted)
        stmt = select(func.count()).select_from(streams).where(*where)
        return int(await conn.scalar(stmt) or 0)


async def call_summary(store, call_id: str, now_us: int, *,
                       stale_after_us: int = STALE_AFTER_US) -> CallSummary | None:
    if not valid_stream_id(call_id):
        return None
    async with engine_of(store).connect() as conn:
        head = (await conn.execute(select(*_HEAD).where(streams.c.stream_id == call_id))).first()
        if head is None:
            return None
        return (await _summaries(conn, [tuple(head)], now_us, stale_after_us))[0]
