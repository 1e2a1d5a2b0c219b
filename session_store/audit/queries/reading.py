"""One call read: in windows, its state at any point, its overview, the signs of delivery.

A long call is read in windows; its overview is one GROUP BY into time buckets; a state is
folded from the nearest snapshot (`StateCache` keeps the recent ones).
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sqlalchemy import func, select

from ...errors import StreamDamaged
from ...storage.loading import snapshot_state
from ...projection import fold_into
from ...records import RecordedEvent
from ...storage.schema import events, streams, valid_stream_id
from ...state import SessionState
from ..fmt import PREVIEW_LIMIT, preview_record, stored_length
from ..timeline import EVIDENCE_TYPES, LANES, Evidence, WholeCall, lane_of, tool_calls_in
from .base import EVENT_COLUMNS, SCAN_CHUNK, engine_of, payload_dict


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
    if not valid_stream_id(call_id):
        return Overview(start_us, end_us, width, counts, first)
    async with engine_of(store).connect() as conn:
        for b, etype, n, v in await conn.execute(stmt):
            b = min(max(int(b), 0), buckets - 1)
            counts[lane_of(etype)][b] += n
            first[b] = v if first[b] is None else min(first[b], v)
    return Overview(start_us, end_us, width, counts, first)


#: What one chunk of `iter_records` may hold in stored JSON, roughly: memory bounded by this
#: or the largest event, not by the call (a 100 MB call was read whole before).
CHUNK_BYTES = 4 << 20


async def iter_records(store, call_id: str, *, from_version: int = 1,
                       to_version: int | None = None, chunk: int = 5000
                       ) -> AsyncIterator[list[RecordedEvent]]:
    """A call's events in version order, at most `chunk` at a time and about CHUNK_BYTES
    (the next chunk's size comes from the biggest event so far, starting small; at least
    one event).

    Chunks are counts of rows, not ranges of versions: on a damaged call (exported all
    the same) a range that ends short only means rows are missing there, not that the call
    ends, and every stored row after the gap still goes out."""
    v, limit, biggest = from_version, 1, 1
    while to_version is None or v <= to_version:
        recs = await store.read(call_id, from_version=v, to_version=to_version, limit=limit)
        if not recs:
            return
        yield recs
        v = recs[-1].version + 1
        if len(recs) < limit:
            return
        biggest = max(biggest, *(len(r.data_json) for r in recs))
        limit = max(1, min(chunk, 2 * limit, CHUNK_BYTES // biggest))


async def read_previews(store, call_id: str, from_version: int = 1,
                        to_version: int | None = None) -> list[RecordedEvent]:
    """A window of a call's events with every long string cut to its preview
    (`fmt.preview_record`), read in chunks: a view that shows previews holds the previews and
    one chunk, never the window's ten-megabyte values all at once."""
    return [preview_record(r) async for chunk in iter_records(
        store, call_id, from_version=from_version, to_version=to_version) for r in chunk]


async def complete_head(store, call_id: str) -> int:
    """The call's head version (0: no such call), once its events are known to be exactly
    versions 1..head; else StreamDamaged, naming what is off.

    The tools read a call by version ranges up to its head: rows deleted from the middle or
    the end, a head row deleted, or rows written past the head would otherwise just be left
    out, and what is left would pass for the whole call (or for "not found"). One statement
    (one snapshot: a call being written cannot look damaged), an aggregate over the call's
    index range; no rows are read.
    """
    if not valid_stream_id(call_id):
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
    """Folded states of calls at checkpoint versions (every `every`), for a few calls, kept
    pickled: at most `max_bytes` in all, and none bigger than a quarter of it (a state holds
    its call's conversation: a 100 MB call's states stayed in the viewer after one look).

    A stored event never changes (the hash chain says so), so a state at version v is the
    same whenever it is computed: clicking through a 50,000-event call folds each stretch once.
    """
    every: int = 10_000
    #: Keeps states folded from previews (`state_at(previews=True)`), never whole ones.
    previews: bool = False
    #: The previews' cut (`fmt.preview_record`), for folds of previews.
    preview_limit: int = PREVIEW_LIMIT
    max_calls: int = 16
    #: States kept per call besides the checkpoints (the windows last looked at).
    max_extra: int = 8
    max_bytes: int = 64 << 20
    _by_call: "OrderedDict[str, dict[int, bytes]]" = field(default_factory=OrderedDict)

    def best(self, call_id: str, at: int) -> SessionState | None:
        """The latest state kept at or before `at`: the caller's own copy."""
        points = self._by_call.get(call_id)
        if not points:
            return None
        self._by_call.move_to_end(call_id)
        usable = [v for v in points if v <= at]
        return pickle.loads(points[max(usable)]) if usable else None

    def put(self, call_id: str, state: SessionState) -> None:
        """Keep a copy of `state` (unless it is too big to)."""
        kept = pickle.dumps(state, pickle.HIGHEST_PROTOCOL)
        if len(kept) > self.max_bytes // 4:
            return
        points = self._by_call.setdefault(call_id, {})
        points[state.version] = kept
        extra = [v for v in points if v % self.every]
        for v in extra[:max(len(extra) - self.max_extra, 0)]:  # (dicts keep insertion order)
            del points[v]
        self._by_call.move_to_end(call_id)
        while len(self._by_call) > self.max_calls or (
                len(self._by_call) > 1 and self.size() > self.max_bytes):
            self._by_call.popitem(last=False)
        points = self._by_call.get(call_id, {})
        while points and self.size() > self.max_bytes:
            del points[next(iter(points))]

    def size(self) -> int:
        return sum(len(b) for points in self._by_call.values() for b in points.values())


def _private(state: SessionState) -> SessionState:
    """A copy no one else holds (pickle: several times faster than deepcopy on a state with
    thousands of calls)."""
    return pickle.loads(pickle.dumps(state, pickle.HIGHEST_PROTOCOL))


async def state_of_read(store, call_id: str, at: int, cache: StateCache | None = None,
                        **options) -> SessionState:
    """`state_at` for a call whose events were just read: StreamDamaged if it has none."""
    state = await state_at(store, call_id, at, cache, **options)
    if state is None:
        raise StreamDamaged(f"{call_id}: its events were read, then none were there")
    return state


async def state_at(store, call_id: str, at: int | None = None,
                   cache: StateCache | None = None, *,
                   after: SessionState | None = None,
                   remember: bool = False, previews: bool = False,
                   preview_limit: int = PREVIEW_LIMIT,
                   whole_calls: frozenset[str] = frozenset()) -> SessionState | None:
    """The projection after version `at` (default: the newest); None if the call is unknown.
    The caller's own copy (it may fold more events into it).

    Starts from the nearest of: a cached checkpoint, a stored snapshot, or `after` (a state
    of this call the caller has), at or before `at`. `remember`: keep the result in the cache
    too (a window's edges: the next look at the same window folds nothing).

    `previews`: the fold of the events' previews (`fmt.preview_record`: long strings cut),
    for a view that shows no value whole: its memory is bounded by the largest event, not by
    the call's conversation. Such states and whole ones never share a cache (nor `after`).
    `preview_limit`: the previews' cut (`fmt.preview_record`). `whole_calls`: the tool events
    of these calls are folded whole (their arguments, results and errors are whole in the
    state; `whole_values_of`), with no cache.
    """
    if cache is not None and (cache.previews != previews or whole_calls or (
            previews and cache.preview_limit != preview_limit)):
        raise ValueError("a state cache keeps either folds of previews or whole states")

    def lean(rec: RecordedEvent) -> RecordedEvent:
        if (whole_calls and len(rec.data_json) > 4 * preview_limit
                and rec.type.startswith("tool.") and tool_calls_in([rec]) & whole_calls):
            return rec
        return preview_record(rec, preview_limit)

    head = await store.stream_version(call_id) if valid_stream_id(call_id) else 0
    if head == 0:
        return None
    target = head if at is None else max(0, min(at, head))
    start = SessionState(stream_id=call_id)
    cached = cache.best(call_id, target) if cache else None
    if cached is not None:
        start = cached
    if after is not None and start.version < after.version <= target:
        start = after
    snap = await snapshot_state(store, call_id, max_version=target)
    # A compacted snapshot (all the driver saves) lacks the conversation and the calls
    # settled for good: shown as "the state", it would be a wrong one.
    if snap is not None and snap.history_complete and snap.version > start.version:
        start = snap
    state = _private(start) if start is after else start  # (`best` gave a copy)
    every = cache.every if cache else 10_000
    while state.version < target:
        hi = min(target, (state.version // every + 1) * every)
        got = state.version
        async for recs in iter_records(store, call_id, from_version=got + 1, to_version=hi):
            fold_into(state, [lean(r) for r in recs] if previews else recs)
            got = recs[-1].version
        if got != hi:
            # The head row promises events up to `target` that are not stored: showing the
            # fold of what is left as "the state" would be a wrong answer.
            raise StreamDamaged(f"the head says version {head} but the events end at {got} "
                                "(events deleted from the end?)", stream_id=call_id,
                                version=got + 1)
        if cache is not None and state.version % every == 0:
            cache.put(call_id, state)
    if remember and cache is not None and state.version % every and start is not cached:
        cache.put(call_id, state)
    return state


async def whole_values_of(store, call_id: str, whole: WholeCall,
                          call_ids: set[str]) -> WholeCall:
    """`whole` (the facts of a call, its state a fold of previews) with the arguments,
    results and errors of `call_ids` whole, for a timeline that shows them whole (`timeline
    --json`): the same facts when none of them was cut, else the call folded again with the
    tool events of these calls (and of the calls they take their outcome from) whole, the
    rest as previews. Memory: those values and the largest event, not the call."""
    s, ids = whole.state, set()
    todo = [cid for cid in call_ids if cid in s.calls]
    while todo:  # a re-issued call takes its outcome from the call it re-asks for
        cid = todo.pop()
        c = s.calls.get(cid)
        if cid in ids or c is None:
            continue
        ids.add(cid)
        todo += [x for x in (c.reissue_of, c.reused_from) if x]
    if not any(_was_cut(v) for cid in ids
               for v in (s.calls[cid].args, s.calls[cid].result, s.calls[cid].error)):
        return whole
    state = await state_of_read(store, call_id, s.version, previews=True,
                                whole_calls=frozenset(ids))
    return WholeCall(state, whole.evidence, whole.deferred)


def _was_cut(value) -> bool:
    """A value holding a preview of a string (`fmt.clip_strings`)."""
    if isinstance(value, str):
        return stored_length(value) != len(value)
    if isinstance(value, dict):
        return any(_was_cut(v) for v in value.values())
    if isinstance(value, list):
        return any(_was_cut(v) for v in value)
    return False


async def window_facts(store, call_id: str, first: int, last: int, head: int,
                       cache: StateCache | None = None, tool_calls: set[str] | None = None,
                       *, previews: bool = False):
    """What a window [first, last] of a call needs to state whole-call facts: the state and
    the event just before it (`timeline.Prior`), and the call's final state, the signs of
    delivery after the sends of `tool_calls` (default: all) and the tool calls ever deferred
    (`timeline.WholeCall`).

    (prior, whole, note). A part of a call is how a damaged row is looked at: when the call
    cannot be folded (a corrupt row), a window that is not the whole call gets what can be
    read and `note` says why the rest is missing; the whole call raises, as every reader.
    `previews`: the states are folds of previews (`state_at`), for a timeline of previews."""
    from ...errors import SessionStoreError
    from ..timeline import Prior, WholeCall

    try:
        prior = None
        if first > 1:
            before = await state_of_read(store, call_id, first - 1, cache, remember=True,
                                         previews=previews)
            rec = await store.read(call_id, from_version=first - 1, to_version=first - 1)
            if rec and previews:
                rec = [preview_record(rec[0])]
            prior = Prior(before, rec[0] if rec else None,
                          await _episode_context(store, call_id, first))
        final = await state_of_read(store, call_id, head, cache, remember=True,
                                    after=prior.state if prior is not None else None,
                                    previews=previews)
    except SessionStoreError as exc:
        if first == 1 and last == head:
            raise
        return None, None, str(exc)
    deferred = set()
    async with engine_of(store).connect() as conn:
        for (data,) in await conn.execute(select(events.c.data).where(
                events.c.stream_id == call_id, events.c.type == "tool.call_deferred")):
            cid = payload_dict(data).get("call_id")
            if isinstance(cid, str):
                deferred.add(cid)
    evidence = await evidence_for(store, call_id, final, tool_calls)
    return prior, WholeCall(final, evidence, deferred), None


async def _episode_context(store, call_id: str, first: int) -> list[RecordedEvent]:
    """The events that say why a session is down when a window opens at `first`: those of
    EPISODE_TYPES since the last connect before it."""
    from ..timeline import EPISODE_TYPES

    async with engine_of(store).connect() as conn:
        since = await conn.scalar(select(func.max(events.c.version)).where(
            events.c.stream_id == call_id, events.c.version < first,
            events.c.type == "connection.connected")) or 0
        rows = (await conn.execute(
            select(*EVENT_COLUMNS).where(events.c.stream_id == call_id, events.c.version > since,
                                  events.c.version < first, events.c.type.in_(EPISODE_TYPES))
            .order_by(events.c.version).limit(SCAN_CHUNK))).all()
    return [RecordedEvent(*r) for r in rows]


async def evidence_for(store, call_id: str, final: SessionState,
                       tool_calls: set[str] | None = None) -> Evidence:
    """Signs that each confirmed send (of `tool_calls`; default all) reached the model, read
    from the log: only events of EVIDENCE_TYPES from the first send on, and only until every
    send is resolved."""
    from ..timeline import confirmed_sends

    ev = Evidence(k for k in confirmed_sends(final) if tool_calls is None or k[0] in tool_calls)
    if ev.done:
        return ev
    v = min(versions[0] for versions in ev.pending.values())
    async with engine_of(store).connect() as conn:
        while not ev.done:
            rows = (await conn.execute(
                select(*EVENT_COLUMNS).where(events.c.stream_id == call_id, events.c.version >= v,
                                      events.c.type.in_(EVIDENCE_TYPES))
                .order_by(events.c.version).limit(SCAN_CHUNK))).all()
            for row in rows:
                ev.feed(RecordedEvent(*row))
            if len(rows) < SCAN_CHUNK:
                break
            v = rows[-1][1] + 1
    return ev


async def version_at_time(store, call_id: str, at_us: int) -> int:
    """The last version recorded at or before `at_us` (the first, if the time is before the
    call began)."""
    async with engine_of(store).connect() as conn:
        v = await conn.scalar(select(func.max(events.c.version)).where(
            events.c.stream_id == call_id, events.c.recorded_at_us <= at_us))
    return int(v or 1)
