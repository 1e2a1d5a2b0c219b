"""Group commit: the queue of checked appends, the writer tasks, retries under deadlines.

Callers enqueue (stream, events, expected version) and await their own future; writer tasks
take whatever is queued and commit it in one transaction, checking each request's expected
version (and fencing epoch) against the stream's head row. So concurrent sessions share
commits while each caller still gets its own conflict check and its own durable
acknowledgement. How one batch is committed is the dialect's (`Committer`); when, with whom,
and how often it is tried again is decided here, the same for every dialect.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any, Protocol

from . import observers
from .batch import BatchPlan, _AppendRequest, _RequestQueue, _RetryBatch
from .heads import HeadCache
from ..errors import StoreUnavailable

log = logging.getLogger(__name__)


class Committer(Protocol):
    """What a dialect gives the group commit: one batch committed its way, and what its
    errors mean. The rest (when, with whom, how often to try again) is decided here."""

    @property
    def caller_commits(self) -> CallerCommits | None:
        """A way to commit an append on the appending thread while the store is idle, or
        None."""

    async def run_batch(self, batch: list[_AppendRequest], cached: BatchPlan | None
                        ) -> BatchPlan:
        """One transaction that writes `cached` (the plan from the head cache) if every head
        it read still holds, else plans from the heads it reads under lock; commits; returns
        the plan it committed."""

    def attempt_abandoned(self) -> None:
        """An attempt was cut (`GroupCommit._attempt`): make sure it cannot commit later."""

    def is_outage(self, exc: BaseException) -> bool:
        """Is this a lost or unreachable database (retry) rather than a bug (raise)?"""

    def describe_outage(self, exc: BaseException) -> str:
        """What went wrong, for StoreUnavailable and the log (`describe_outage` below, with
        whatever detail the driver adds)."""


def describe_outage(exc: BaseException) -> str:
    """An outage error as the log and StoreUnavailable say it: its class and first line."""
    said = (str(exc).splitlines() or [''])[0]
    if not said and isinstance(exc, TimeoutError):
        said = "no answer in time"
    return f"{exc.__class__.__name__}: {said}"


class CallerCommits(Protocol):
    """A dialect's way to commit an append synchronously on the appending thread, when the
    store is idle (SQLite's inline commits, opt-in)."""

    def ready(self, stream_id: str, urgent: bool) -> bool:
        """May an append to `stream_id` that finds the store idle commit here? Asked at
        every such append (it may track who appends)."""

    def commit(self, request: _AppendRequest, cached: BatchPlan | None
               ) -> BatchPlan | BaseException | None:
        """Commit one request: its plan, the error to raise, or None to hand it to the
        writers instead (nothing acknowledged)."""


class _NoAnswer(TimeoutError):
    """An attempt abandoned because the database said nothing in time (an outage)."""


def _by_acceptance(request: _AppendRequest) -> int:
    return request.seq


def _settle(request: _AppendRequest, outcome: Any) -> None:
    """Hand an append its outcome (a new version or an error), unless it already has one."""
    if request.future is None or request.future.done():
        return
    if isinstance(outcome, BaseException):
        request.future.set_exception(outcome)
    else:
        request.future.set_result(outcome)


def _raise_or_return(outcome: Any) -> Any:
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


class GroupCommit:
    """The append side of one store: accepts checked requests and commits them through the
    dialect's committer; every commit that lands calls `on_change` (followers wake)."""

    #: An attempt (connect and commit) is never cut sooner than this, however close the
    #: deadline of an append in it: a healthy commit under load must not be mistaken for a
    #: lost database (see `_attempt`).
    min_attempt_s = 0.5

    def __init__(self, committer: Committer, heads: HeadCache, stats: dict[str, int], *,
                 on_change: Callable[[], None], max_batch_events: int,
                 attempt_timeout: float | None):
        self._committer = committer
        self._heads = heads
        self._stats = stats
        self._on_change = on_change
        self._max_batch_events = max_batch_events
        self._attempt_timeout = attempt_timeout
        self.caller_commits = committer.caller_commits
        self._queue = _RequestQueue()
        self._writers: list[asyncio.Task] = []
        self._closed = False
        # Appends accepted and not yet returned (queued, committing, or about to go inline).
        self._inflight = 0
        # Appends committing from their own coroutine (`_append_direct`), and when none is.
        self._direct = 0
        self._no_direct = asyncio.Event()
        self._no_direct.set()
        self._seq = itertools.count()

    def start(self, writers: int) -> None:
        self._writers = [asyncio.create_task(self._writer_loop(), name=f"session-store-writer-{i}")
                         for i in range(writers)]

    async def close(self) -> None:
        self._closed = True
        # An append accepted just before may be yielding before it commits inline or queues
        # in front (see `submit`): let it, so it is never behind the stop sentinels.
        await asyncio.sleep(0)
        # A direct append hands a failed commit to the writer tasks: they must still run.
        await self._no_direct.wait()
        for _ in self._writers:
            self._queue.put_nowait(None)
        if self._writers:
            await asyncio.gather(*self._writers, return_exceptions=True)

    # ------------------------------------------------------------------ accepting
    async def submit(self, request: _AppendRequest, urgent: bool) -> int:
        """Commit a checked request (on the caller's thread, from the caller, or through the
        writer tasks); its new version, or its error raised."""
        request.seq = next(self._seq)
        loop = asyncio.get_running_loop()
        stream_id = request.stream_id
        self._inflight += 1
        try:
            front = False
            if self._may_commit_on_caller(stream_id, urgent):
                # Alone, and the store serves only this stream (the dialect's rule): commit
                # right here, after one loop turn. The commit holds the loop (an fsync):
                # whatever is ready to run goes first. In a live call that is the audio the
                # service pushed before the toolCall: without the turn it waited for both of
                # the call's commits (bench/turn_overhead.py, SQLite inline="urgent": audio
                # p50 +0.5 to +2.6 ms against stock; with it, -1.6 to +0.3), and a caller
                # appending in a tight loop would starve every other task. The turn costs the
                # tool call that processing: 0.2-0.8 ms of its p50 there.
                await asyncio.sleep(0)
                if self._may_commit_on_caller(stream_id, urgent):  # others may have come
                    outcome = self._commit_on_caller(request)
                    if outcome is not None:
                        self._on_change()
                        return _raise_or_return(outcome)
                front = True  # it came first: it still goes first
            request.future = loop.create_future()
            if self._alone() and not urgent:
                await asyncio.sleep(0)  # appends issued together still batch together
                front = True  # it came first: it still goes first
            if self._alone():
                # Alone: commit it from here, through the same writer (process or
                # connection), instead of waking a writer task that wakes us back. Each of
                # those hops waits its turn behind whatever else the loop runs (in a live
                # call, the audio frames of the turn) and they were most of a tool call's
                # commit time (bench/turn_overhead.py). Appends that come meanwhile queue for
                # the writer tasks, as before. One that is not urgent first gives the loop a
                # turn (above): appends issued together then find each other and share one
                # commit of the writer tasks.
                outcome = await self._append_direct(request)
                if outcome is not None:
                    self._on_change()
                    return _raise_or_return(outcome)
                front = True
            self._queue.put_nowait(request, front=front)
            try:
                return await request.future
            except asyncio.CancelledError:
                # The caller gave up: it will read the stream again and decide again, so
                # this append must not land later (while the database is down it could
                # wait for its whole deadline). Still queued: gone; in a batch being retried:
                # dropped before the next try (`_drop_abandoned`); in a commit under way:
                # in doubt, as when a connection breaks mid-commit.
                self._queue.discard(request)
                raise
        finally:
            self._inflight -= 1

    def _alone(self) -> bool:
        return self._inflight == 1 and self._queue.empty() and not self._closed

    def _may_commit_on_caller(self, stream_id: str, urgent: bool) -> bool:
        """Is this append alone (nothing queued or committing) and may it commit here? (Not
        once the store is closing: what it accepted goes to the writer tasks it drains.)"""
        return (self.caller_commits is not None and self._inflight == 1
                and self._queue.empty() and self.caller_commits.ready(stream_id, urgent)
                and not self._closed)

    def _commit_on_caller(self, request: _AppendRequest) -> Any:
        """Commit one request synchronously (`CallerCommits`): its outcome, or None."""
        batch = [request]
        assert self.caller_commits is not None  # (_may_commit_on_caller asked first)
        result = self.caller_commits.commit(request, self._heads.plan(batch))
        if result is None or isinstance(result, BaseException):
            self._heads.forget(batch)
            return result
        self._counted(batch, result, "inline")
        return result.outcomes[0]

    async def _append_direct(self, request: _AppendRequest) -> Any:
        """Commit one request from the appending coroutine: one try, no outage retry (a
        failure of any kind hands it to the writer tasks, which retry and report it, exactly
        as if it had queued). Returns its outcome, or None when handed over."""
        batch = [request]
        self._direct += 1
        self._no_direct.clear()
        try:
            plan = await self._attempt(batch)
        except Exception as exc:  # noqa: BLE001 - the writer tasks retry it and report it
            # (Its plan's hashes stay on the request: a commit whose answer was lost is
            # recognised on the retry.)
            self._heads.forget(batch)
            if self._lost(exc) and request.deadline <= asyncio.get_running_loop().time():
                return self._unavailable(exc)  # its time is up: another try cannot help it
            return None
        finally:
            self._direct -= 1
            if not self._direct:
                self._no_direct.set()
        self._counted(batch, plan, "direct")
        return plan.outcomes[0]

    def _counted(self, batch: list[_AppendRequest], plan: BatchPlan, path: str) -> None:
        """A batch of one committed outside the writer tasks: its heads, its figures."""
        self._heads.remember(batch, plan)
        self._stats["batches"] += 1
        self._stats[path] += 1
        self._stats["events"] += len(batch[0].rows)
        if observers.observer is not None:
            observers.observer.committed(len(batch[0].rows))

    # ------------------------------------------------------------------ writer tasks
    async def _writer_loop(self) -> None:
        while True:
            first = await self._queue.get()
            if first is None:
                return
            if self._direct:
                # An append is committing from its own coroutine: if it fails, it is handed
                # over to the front of the queue, and must commit before these, which came
                # after it (taken now, one of them could beat it to the database).
                await self._no_direct.wait()
            batch = [first]
            self._take_queued(batch)
            if not batch:
                continue
            try:
                await self._commit_with_retry(batch)
            except Exception as exc:  # noqa: BLE001 - every caller must hear about it
                for request in batch:
                    _settle(request, exc)
            self._stats["batches"] += 1
            self._stats["events"] += sum(len(r.rows) for r in batch)
            self._on_change()

    def _take_queued(self, batch: list[_AppendRequest]) -> None:
        """Move queued appends into `batch`, up to max_batch_events (a close stays queued),
        in the order they were accepted, without those whose caller gave up."""
        size = sum(len(r.rows) for r in batch)
        while size < self._max_batch_events and not self._queue.empty():
            nxt = self._queue.get_nowait()
            if nxt is None:  # closing: finish this batch, then stop
                self._queue.put_nowait(None, front=True)
                break
            batch.append(nxt)
            size += len(nxt.rows)
        self._drop_abandoned(batch)
        # (One handed back by a failed direct commit, or taken into a retry, may have come
        # before requests already in the batch: the first of two competing appends wins,
        # and an append chained onto another commits after it.)
        batch.sort(key=_by_acceptance)

    def _drop_abandoned(self, batch: list[_AppendRequest]) -> None:
        abandoned = [r for r in batch if r.abandoned]
        if abandoned:
            batch[:] = [r for r in batch if not r.abandoned]
            self._heads.forget(abandoned)  # (an earlier try of theirs may have committed)

    async def _commit_with_retry(self, batch: list[_AppendRequest]) -> None:
        """Commit a batch and settle each request's future; on an outage, retry with backoff.

        Each request waits for the database up to its own deadline, with a last try at it:
        one whose deadline passes fails alone with StoreUnavailable (and leaves `batch`)
        while the others keep waiting, and appends queued meanwhile join the retries, so
        they wait for the same recovery under their own deadlines instead of behind this
        batch. (Failing the whole batch at its earliest deadline failed appends that had
        30 s to wait after 1 s, because they shared a commit with a 1 s one:
        tests/faults/test_db_outage.py.)
        """
        loop = asyncio.get_running_loop()
        delay = 0.02
        while batch:
            self._drop_abandoned(batch)
            if not batch:
                return
            try:
                plan = await self._attempt(batch)
            except _RetryBatch:
                self._heads.forget(batch)
                self._stats["retries"] += 1
                continue
            except Exception as exc:  # noqa: BLE001 - sorted out below
                # Whatever happened, the database says next time what the heads are.
                self._heads.forget(batch)
                if not self._lost(exc) and len(batch) > 1:
                    # A row raced us past the head check, or one request holds what the
                    # database refuses: commit each request on its own, so one caller's
                    # problem does not fail the others (each gets its own outcome; a request
                    # that fails alone fails with its own error, and the rest still commit).
                    self._stats["retries"] += 1
                    for request in list(batch):
                        try:
                            await self._commit_with_retry([request])
                        except Exception as alone:  # noqa: BLE001 - its own outcome
                            _settle(request, alone)
                    return
                if not self._lost(exc):
                    raise
                now = loop.time()
                for request in [r for r in batch if r.deadline <= now]:
                    batch.remove(request)
                    _settle(request, self._unavailable(exc))
                self._take_queued(batch)
                if not batch:
                    return
                wait = min(delay, min(r.deadline for r in batch) - now)
                log.warning("append failed (%s); retrying in %.2fs",
                            self._committer.describe_outage(exc), wait)
                self._stats["retries"] += 1
                await asyncio.sleep(max(wait, 0.0))
                delay = min(delay * 2, 1.0)
                continue
            self._heads.remember(batch, plan)
            for request, outcome in zip(batch, plan.outcomes):
                _settle(request, outcome)
            if observers.observer is not None:
                observers.observer.committed(sum(len(r.rows) for r in batch))
            return

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"the database did not accept the append within its deadline "
            f"({self._committer.describe_outage(exc)}); it was not acknowledged (if the "
            "connection broke during the commit it may still have been written: read the "
            "stream again before the next append)")

    async def _attempt(self, batch: list[_AppendRequest]) -> BatchPlan:
        """One try at committing a batch, abandoned at its earliest deadline or after
        `attempt_timeout` (if set), whichever comes first, but never before `min_attempt_s`.

        A database that crashes or restarts closes its sockets, and the attempt fails at
        once; a host behind a dead network says nothing, and a statement would wait as
        long as TCP lets it (minutes); a SQLite writer on a disk that stopped answering (or
        a stopped process) never answers. Either held every append of the batch past its
        deadline (and a service's receive loop with them). An abandoned attempt fails as an
        outage: the dialect makes sure it cannot commit later (`attempt_abandoned`), the
        batch is retried under each append's own deadline, and a commit whose answer was
        lost is recognised by its hashes."""
        remaining = min(r.deadline for r in batch) - asyncio.get_running_loop().time()
        budget = max(remaining, self.min_attempt_s)
        if self._attempt_timeout is not None:
            budget = min(budget, self._attempt_timeout)
        try:
            async with asyncio.timeout(budget):
                return await self._committer.run_batch(batch, self._heads.plan(batch))
        except TimeoutError as exc:  # (or the driver's own, connecting: the same outage)
            self._committer.attempt_abandoned()
            raise _NoAnswer(f"the database gave no answer within {budget:.2f}s") from exc

    def _lost(self, exc: BaseException) -> bool:
        """An outage (retry until the deadlines), as opposed to a bug (raise)."""
        return isinstance(exc, _NoAnswer) or self._committer.is_outage(exc)
