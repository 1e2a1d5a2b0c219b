"""Read-only queries the CLI and the web viewer share (the only I/O of this package).

Everything is SQLAlchemy Core with bound parameters. Listings never fold calls: a page of
stream heads comes from `session_streams`, its counts from one GROUP BY over that page's
events (the (stream_id, version) index), so a listing costs the same with 100 or 100,000
calls. A long call is read in windows; its overview is one GROUP BY into time buckets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sqlalchemy import and_, exists, func, not_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import StreamDamaged
from ..loading import snapshot_state
from ..projection import SessionState, fold
from ..records import RecordedEvent
from ..schema import events, streams, valid_id
from .summaries import (COUNTED_TYPES, STALE_AFTER_US, CallFilter, CallSummary, like_pattern,
                        summarise)
from .timeline import LANES, lane_of

_HEAD = (streams.c.stream_id, streams.c.version, streams.c.epoch, streams.c.created_at_us,
         streams.c.updated_at_us)


def engine_of(store) -> AsyncEngine:
    """The store's engine (read-only use)."""
    engine = getattr(store, "engine", None)
    return engine if isinstance(engine, AsyncEngine) else store._engine


def _closed():
    return exists().where(events.c.stream_id == streams.c.stream_id,
                          events.c.type == "session.closed")


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
    return conds


@dataclass
class CallPage:
    calls: list[CallSummary]
    next_after: str | None  # pass as `after` for the next page; None on the last page

    def to_json(self) -> dict:
        return {"calls": [c.to_json() for c in self.calls], "next_after": self.next_after}


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


async def list_calls(store, flt: CallFilter, now_us: int, *,
                     stale_after_us: int = STALE_AFTER_US) -> CallPage:
    """One page of calls, newest first (ties by call id), with their counts. ValueError when
    `after` names no call: its page would be empty, read as the end of the list."""
    stmt = (select(*_HEAD).where(*_where(flt, now_us, stale_after_us))
            .order_by(streams.c.created_at_us.desc(), streams.c.stream_id.desc())
            .limit(flt.limit + 1))
    async with engine_of(store).connect() as conn:
        if flt.after is not None:
            after_start = None
            if valid_id(flt.after):
                after_start = (await conn.execute(select(streams.c.created_at_us).where(
                    streams.c.stream_id == flt.after))).scalar()
            if after_start is None:
                raise ValueError(f"after: there is no call {flt.after!r} (give the last call "
                                 "id of the previous page)")
            stmt = stmt.where(or_(
                streams.c.created_at_us < after_start,
                and_(streams.c.created_at_us == after_start, streams.c.stream_id < flt.after)))
        if flt.search is not None and not valid_id(flt.search, 10_000):
            return CallPage([], None)  # no call id holds it
        rows = [tuple(r) for r in await conn.execute(stmt)]
        more = len(rows) > flt.limit
        rows = rows[:flt.limit]
        counts = await _counts(conn, [r[0] for r in rows])
    calls = [summarise(r, counts[r[0]], now_us, stale_after_us) for r in rows]
    return CallPage(calls, rows[-1][0] if more and rows else None)


async def count_calls(store, flt: CallFilter, now_us: int, *,
                      stale_after_us: int = STALE_AFTER_US) -> int:
    if flt.search is not None and not valid_id(flt.search, 10_000):
        return 0
    stmt = select(func.count()).select_from(streams).where(*_where(flt, now_us, stale_after_us))
    async with engine_of(store).connect() as conn:
        return int(await conn.scalar(stmt) or 0)


async def call_summary(store, call_id: str, now_us: int, *,
                       stale_after_us: int = STALE_AFTER_US) -> CallSummary | None:
    if not valid_id(call_id):
        return None
    async with engine_of(store).connect() as conn:
        head = (await conn.execute(select(*_HEAD).where(streams.c.stream_id == call_id))).first()
        if head is None:
            return None
        counts = await _counts(conn, [call_id])
    return summarise(tuple(head), counts[call_id], now_us, stale_after_us)


# ---------------------------------------------------------------------------- overview

@dataclass
class Overview:
    """Event counts of a call per lane in equal time buckets (the zoomed-out lane)."""
    start_us: int
    end_us: int
    bucket_us: int
    counts: dict[str, list[int]]  # lane -> count per bucket
    first_version: list[int | None]  # the first event version in each bucket (to jump there)

    def to_json(self) -> dict:
        return {"start_us": self.start_us, "end_us": self.end_us, "bucket_us": self.bucket_us,
                "counts": self.counts, "first_version": self.first_version}


async def overview(store, call_id: str, start_us: int, end_us: int,
                   buckets: int = 120) -> Overview:
    span = max(end_us - start_us, 1)
    width = -(-span // buckets) or 1  # ceiling: bucket index stays below `buckets`
    bucket = (events.c.recorded_at_us - start_us) // width
    stmt = (select(bucket.label("b"), events.c.type, func.count(), func.min(events.c.version))
            .where(events.c.stream_id == call_id)
            .group_by(bucket, events.c.type))
    counts = {lane: [0] * buckets for lane in LANES}
    first: list[int | None] = [None] * buckets
    if not valid_id(call_id):
        return Overview(start_us, end_us, width, counts, first)
    async with engine_of(store).connect() as conn:
        for b, etype, n, v in await conn.execute(stmt):
            b = min(max(int(b), 0), buckets - 1)
            counts[lane_of(etype)][b] += n
            first[b] = v if first[b] is None else min(first[b], v)
    return Overview(start_us, end_us, width, counts, first)


# ---------------------------------------------------------------------------- reading

async def iter_records(store, call_id: str, *, from_version: int = 1,
                       to_version: int | None = None, chunk: int = 5000
                       ) -> AsyncIterator[list[RecordedEvent]]:
    """A call's events in version order, `chunk` at a time (bounded memory).

    Chunks are `chunk` rows, not ranges of `chunk` versions: on a damaged call (exported all
    the same) a range that ends short only means rows are missing there, not that the call
    ends, and every stored row after the gap still goes out."""
    v = from_version
    while to_version is None or v <= to_version:
        recs = await store.read(call_id, from_version=v, to_version=to_version, limit=chunk)
        if not recs:
            return
        yield recs
        v = recs[-1].version + 1
        if len(recs) < chunk:
            return


async def complete_head(store, call_id: str) -> int:
    """The call's head version (0: no such call), once its events are known to be exactly
    versions 1..head; else StreamDamaged, naming what is off.

    The tools read a call by version ranges up to its head: rows deleted from the middle or
    the end, a head row deleted, or rows written past the head would otherwise just be left
    out, and what is left would pass for the whole call (or for "not found"). One statement
    (one snapshot: a call being written cannot look damaged), an aggregate over the call's
    index range; no rows are read.
    """
    if not valid_id(call_id):
        return 0
    head = select(streams.c.version).where(streams.c.stream_id == call_id).scalar_subquery()
    stmt = select(head, func.count(), func.min(events.c.version),
                  func.max(events.c.version)).where(events.c.stream_id == call_id)
    async with engine_of(store).connect() as conn:
        version, n, lo, hi = (await conn.execute(stmt)).one()
    if version is None and not n:
        return 0
    if version is None:
        raise StreamDamaged(f"it has {n} events but no head row (the row in session_streams "
                            "was deleted?)", stream_id=call_id, version=None)
    if (n, lo, hi) != (version, 1, version):
        missing = ("events are missing" if n < version or (hi or 0) < version
                   else "events were added past the head")
        raise StreamDamaged(f"the head row says {version} events, the log holds {n} "
                            f"(versions {lo}-{hi}): {missing}", stream_id=call_id,
                            version=None)
    return version


@dataclass
class StateCache:
    """Folded states of calls at checkpoint versions (every `every`), for a few calls.

    A stored event never changes (the hash chain says so), so a state at version v is the
    same whenever it is computed: clicking through a 50,000-event call folds each stretch once.
    """
    every: int = 10_000
    max_calls: int = 16
    _by_call: "OrderedDict[str, dict[int, SessionState]]" = field(default_factory=OrderedDict)

    def best(self, call_id: str, at: int) -> SessionState | None:
        points = self._by_call.get(call_id)
        if not points:
            return None
        self._by_call.move_to_end(call_id)
        usable = [v for v in points if v <= at]
        return points[max(usable)] if usable else None

    def put(self, call_id: str, state: SessionState) -> None:
        points = self._by_call.setdefault(call_id, {})
        points[state.version] = state
        self._by_call.move_to_end(call_id)
        while len(self._by_call) > self.max_calls:
            self._by_call.popitem(last=False)


async def state_at(store, call_id: str, at: int | None = None,
                   cache: StateCache | None = None) -> SessionState | None:
    """The projection after version `at` (default: the newest); None if the call is unknown.

    Starts from the nearest cached checkpoint or stored snapshot at or before `at`.
    """
    head = await store.stream_version(call_id) if valid_id(call_id) else 0
    if head == 0:
        return None
    target = head if at is None else max(0, min(at, head))
    state = SessionState(stream_id=call_id)
    cached = cache.best(call_id, target) if cache else None
    if cached is not None:
        state = cached
    snap = await snapshot_state(store, call_id, max_version=target)
    # A compacted snapshot (all the driver saves) lacks the conversation and the calls
    # settled for good: shown as "the state", it would be a wrong one.
    if snap is not None and snap.history_complete and snap.version > state.version:
        state = snap
    every = cache.every if cache else 10_000
    while state.version < target:
        hi = min(target, (state.version // every + 1) * every)
        recs = await store.read(call_id, from_version=state.version + 1, to_version=hi)
        if not recs or recs[-1].version != hi:
            # The head row promises events up to `target` that are not stored: showing the
            # fold of what is left as "the state" would be a wrong answer.
            got = recs[-1].version if recs else state.version
            raise StreamDamaged(f"the head says version {head} but the events end at {got} "
                                "(events deleted from the end?)", stream_id=call_id,
                                version=got + 1)
        state = fold(recs, state)
        if cache is not None and state.version % every == 0:
            cache.put(call_id, state)
    return state
