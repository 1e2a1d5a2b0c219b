"""What flows through group commit: append requests, their queue, and the plan of one batch."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..errors import CallClosed, ConcurrencyConflict, Fenced
from ..events import SessionClosed
from ..records import GENESIS_HASH, chain_hash
from ..state import TAKEN_OVER

#: The event after which a call is not taken over (`Claim`).
CLOSED_TYPE = SessionClosed.TYPE


@dataclass(frozen=True)
class Claim:
    """A takeover (`SqlEventStore.take_over`): the events go at the stream's head, whatever
    its version, if the request's epoch is above the stream's. `after_version`: what the
    caller has read; the head must be at it or past it, and no session.closed stored after
    it."""
    after_version: int


@dataclass(eq=False)
class _AppendRequest:
    stream_id: str
    rows: list[tuple[str, int, str]]  # (type, schema_version, data_json), encoded by the caller
    # The version the events go after: the caller's, or for a claim the head's, set when
    # planned (a retry recognises the commit by it, as any other).
    expected_version: int
    epoch: int | None
    recorded_at_us: int
    deadline: float
    future: asyncio.Future | None = None  # only for a request that waits for a writer
    final_hash: str | None = None  # set when first computed: recognises a commit whose ack was lost
    seq: int = 0  # order of acceptance: a batch commits its requests in this order
    claim: Claim | None = None
    unfenced: bool = False  # no epoch, on purpose: goes in after a takeover too (`_refusal`)

    @property
    def abandoned(self) -> bool:
        """Its caller gave up waiting (cancelled): it must not be committed any more."""
        return self.future is not None and self.future.cancelled()


@dataclass
class BatchPlan:
    """What one group commit writes, and each request's outcome (new version or error)."""
    outcomes: list[Any] = field(default_factory=list)
    created: list[tuple] = field(default_factory=list)  # (stream_id, version, hash, epoch, at_us)
    # (stream_id, version, hash, epoch, at_us, old version, old hash, old epoch): the old head
    # is what the row must still hold when it is written (a conditional update).
    updated: list[tuple] = field(default_factory=list)
    events: list[tuple] = field(default_factory=list)  # (stream_id, version, type, schema, data, at_us, hash)
    before: dict[str, tuple[int, str, int]] = field(default_factory=dict)  # heads planned from
    from_cache: bool = False
    stale: bool = False  # planned from the cache, which turned out stale: replanned from the db

    @property
    def failed(self) -> bool:
        return any(isinstance(o, BaseException) for o in self.outcomes)


class _RetryBatch(Exception):
    """A concurrent writer created a stream we meant to create: re-read heads and retry."""


class _RequestQueue:
    """FIFO of append requests for the writer tasks (asyncio.Queue cannot put in front)."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self._waiters: deque[asyncio.Future] = deque()

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item, *, front: bool = False) -> None:
        if front:
            self._items.appendleft(item)
        else:
            self._items.append(item)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def get_nowait(self):
        return self._items.popleft()

    def discard(self, item) -> None:
        with contextlib.suppress(ValueError):
            self._items.remove(item)

    async def get(self):
        while not self._items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                if waiter.done() and not waiter.cancelled() and self._items:
                    self._wake_one()  # woken, then cancelled: pass the wake-up on
                raise
        return self._items.popleft()


def stored_hashes_wanted(batch: list[_AppendRequest]) -> list[tuple[str, int]]:
    """(stream, version) of the last event each retried request would have written: the
    writer reads their stored hashes for `plan_batch` (see `_committed_by_an_earlier_try`)."""
    return sorted({(r.stream_id, r.expected_version + len(r.rows))
                   for r in batch if r.final_hash is not None})


def claims_wanted(batch: list[_AppendRequest]) -> list[tuple[str, int]]:
    """(stream, after_version) of each claim: the writer reads, under the same lock as the
    heads, the first session.closed stored after it (`plan_batch`'s `closed`)."""
    return sorted({(r.stream_id, r.claim.after_version) for r in batch if r.claim is not None})


def plan_batch(batch: list[_AppendRequest],
               heads: dict[str, tuple[int, str, int]],
               stored: dict[tuple[str, int], str] | None = None,
               closed: dict[tuple[str, int], int] | None = None) -> BatchPlan:
    """Check each request against the stream heads and build the rows to write (pure).

    `heads` maps stream id to (version, last_hash, epoch) as read inside the batch's
    transaction (under SQLite's write lock / PostgreSQL row locks), or as cached (then
    the writer checks them when it writes, see `_plan_from_cache`). Requests of one
    stream in one batch chain onto each other. `heads` is updated in place. `stored`: the
    hashes stored at `stored_hashes_wanted(batch)`, as read in the same transaction;
    `closed`: for each of `claims_wanted(batch)` that has one, the version of the first
    session.closed stored after it.
    """
    plan = BatchPlan(before=dict(heads))
    existed = plan.before
    touched: dict[str, int] = {}
    closed = dict(closed or {})
    committed = _committed_by_an_earlier_try(batch, heads, stored or {})
    for r in batch:
        version, last_hash, epoch = heads.get(r.stream_id, (0, GENESIS_HASH, 0))
        n = len(r.rows)
        if id(r) in committed:
            plan.outcomes.append(r.expected_version + n)
            continue
        refused = _refusal(r, version, epoch, closed)
        if refused is not None:
            plan.outcomes.append(refused)
            continue
        r.expected_version = version  # (a claim's: wherever the head is)
        h = last_hash
        for i, (etype, schema_version, data_json) in enumerate(r.rows, start=version + 1):
            h = chain_hash(h, r.stream_id, i, etype, schema_version, r.recorded_at_us,
                           data_json)
            plan.events.append((r.stream_id, i, etype, schema_version, data_json,
                                r.recorded_at_us, h))
            if etype == CLOSED_TYPE:  # (for a claim later in this very batch)
                for key in claims_wanted(batch):
                    if key[0] == r.stream_id and key[1] < i:
                        closed.setdefault(key, i)
        r.final_hash = h
        heads[r.stream_id] = (version + n, h, max(epoch, r.epoch or 0))
        touched[r.stream_id] = r.recorded_at_us
        plan.outcomes.append(version + n)
    # Sorted: every batch creates new streams in one global order, so two batches that
    # create the same streams cannot deadlock on their unique keys (PostgreSQL).
    for sid, at in sorted(touched.items()):
        version, h, epoch = heads[sid]
        old = existed.get(sid)
        if old is None:
            plan.created.append((sid, version, h, epoch, at))
        else:
            plan.updated.append((sid, version, h, epoch, at, *old))
    return plan


def _refusal(r: _AppendRequest, version: int, epoch: int,
             closed: dict[tuple[str, int], int]) -> Exception | None:
    """Why the request cannot go on a head at (version, epoch), or None.

    A claim does not depend on the version: it only needs an epoch above the stream's, so
    an old worker appending as fast as it can never starves it (an append at an expected
    version, read first, lost every race to it). Its commit raises the head's epoch, and
    from then on every append of a lower epoch is Fenced: the old worker's appends that
    committed before it stay, after the version its caller read."""
    if r.claim is None:
        if r.epoch is not None and r.epoch < epoch:
            return Fenced(r.stream_id, r.epoch, epoch)
        if r.epoch is None and epoch >= TAKEN_OVER and not r.unfenced:
            # Without an epoch an old worker's append went in after the takeover that
            # fenced it: after one, appending unfenced is said, not a default.
            return Fenced(r.stream_id, None, epoch)
        if version != r.expected_version:
            return ConcurrencyConflict(r.stream_id, r.expected_version, version)
        return None
    assert r.epoch is not None  # (a claim names the epoch it takes)
    if r.epoch <= epoch:  # another takeover got there first
        return Fenced(r.stream_id, r.epoch, epoch)
    if version < r.claim.after_version:  # the events its caller read are gone
        return ConcurrencyConflict(r.stream_id, r.claim.after_version, version)
    ended = closed.get((r.stream_id, r.claim.after_version))
    if ended is not None:
        return CallClosed(r.stream_id, ended)
    return None


def _committed_by_an_earlier_try(batch: list[_AppendRequest],
                                 heads: dict[str, tuple[int, str, int]],
                                 hashes: dict[tuple[str, int], str]) -> set[int]:
    """The requests (by id) an earlier try of this batch committed, though its answer was
    lost: retried, they must get their version back, not a conflict, and not be written again.

    The head proves the last one of a stream: it holds that request's version and final
    hash. It says nothing directly of a request chained before it in the same batch (two
    appends to one stream, committed together): that one is proved by the hashes, since the
    stored request's hashes chain onto what it was planned on; if they chain onto the earlier
    request's final hash at its version, that is what is stored there. Neither holds once
    another writer appended behind the commit (it read the stream and saw it) before the
    retry: then the event stored at the request's last version proves it, by its hash (the
    chain: that hash covers the request's events and everything before them). Without
    that, the request's own commit was called a conflict, and its caller would decide
    again and log its facts twice.
    """
    committed: set[int] = set()
    proved: dict[str, _AppendRequest] = {}  # per stream: the earliest request proved so far
    for r in reversed(batch):
        if r.final_hash is None:
            continue
        n = len(r.rows)
        later = proved.get(r.stream_id)
        if later is None:
            version, last_hash, _epoch = heads.get(r.stream_id, (0, GENESIS_HASH, 0))
            stored = version == r.expected_version + n and last_hash == r.final_hash
        else:
            stored = (later.expected_version == r.expected_version + n
                      and _chain(later, r.final_hash) == later.final_hash)
        if not stored:
            stored = hashes.get((r.stream_id, r.expected_version + n)) == r.final_hash
        if stored:
            committed.add(id(r))
            proved[r.stream_id] = r
    return committed


def _chain(r: _AppendRequest, prior_hash: str) -> str:
    """The final hash of `r`'s events planned on `prior_hash` at its expected version."""
    h = prior_hash
    for i, (etype, schema_version, data_json) in enumerate(r.rows, start=r.expected_version + 1):
        h = chain_hash(h, r.stream_id, i, etype, schema_version, r.recorded_at_us, data_json)
    return h
