"""The event log over SQLAlchemy Core: one implementation, thin dialect subclasses.

Appends go through a group-commit queue: callers enqueue (stream, events, expected version)
and await their own future; writer tasks take whatever is queued and commit it in one
transaction, checking each request's expected version (and fencing epoch) against the
stream's head row. So concurrent sessions share commits while each caller still gets its
own conflict check and its own durable acknowledgement.

Each dialect commits a batch its own way (SQLite in a writer process over sqlite3, or inline
on the event loop when one append finds the store idle; PostgreSQL over asyncpg). What they
share lives here: the queue, the retry policy, the pure batch planner and a cache of the
stream heads this store committed. The cache saves reading the heads before writing: a batch
planned from it writes its head rows only where they still hold the cached (version, hash,
epoch), so a stream moved by another store or process is caught in the same transaction and
the batch is planned again from the database (see `_plan_from_cache`). Reads, following and
verification are in reads.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine

from ..checks import check_count, check_seconds
from ..errors import SchemaMismatch, StoreClosed, StoreUnavailable, refused
from ..events import Event, canonical_json
from ..schema import HEAD_REVISION, STREAM_ID_MAX, check_known_revisions, valid_id
from .batch import BatchPlan, _AppendRequest, _RequestQueue, _RetryBatch, plan_batch
from .reads import LogReads, now_us

log = logging.getLogger(__name__)


class _NoAnswer(TimeoutError):
    """An attempt abandoned because the database said nothing in time (an outage)."""


def _by_acceptance(request: _AppendRequest) -> int:
    return request.seq


def _check_storable(stream_id: str, rows: list[tuple[str, int, str]]) -> None:
    """ValueError for an append no database of ours can store: the same rule on both (SQLite
    took a stream id PostgreSQL refuses), and said before it shares a commit with others."""
    if not valid_id(stream_id):
        raise ValueError(f"a stream id must be valid UTF-8 text of at most {STREAM_ID_MAX} "
                         f"characters without NUL, not {stream_id!r:.80}")
    try:
        for _type, _schema, data_json in rows:
            data_json.encode()  # (canonical JSON escapes NUL; a lone surrogate stays)
    except UnicodeEncodeError as exc:
        raise ValueError(f"the append cannot be stored: it is not valid UTF-8 ({exc})") from None


def _is_bigint(value: Any) -> bool:
    return type(value) is int and -2 ** 63 <= value < 2 ** 63


def _settle(request: _AppendRequest, outcome: Any) -> None:
    """Hand an append its outcome (a new version or an error), unless it already has one."""
    if request.future is None or request.future.done():
        return
    if isinstance(outcome, BaseException):
        request.future.set_exception(outcome)
    else:
        request.future.set_result(outcome)


class SqlEventStore(LogReads):
    """The log. Use `session_store.open_store(url)` to get the right dialect."""

    dialect_name = "generic"
    default_writers = 1
    #: Wait for a change notification at most this long before polling the table again.
    poll_interval = 0.25

    #: Stream heads kept in memory (most recently written); an evicted one is read again.
    max_cached_heads = 10_000

    #: May an `urgent` append commit on the caller's thread, with no hand-off (SQLite with
    #: inline commits on)? A caller may then keep its other appends out of their way.
    commits_urgent_inline = False

    #: Do lazy facts pay here: may a fact that decides nothing by itself (the send's
    #: confirmation, speech starting) wait to ride along with the next append, so that the
    #: log is free when a tool call comes? SQLite: yes, one commit at a time, off the event
    #: loop's GIL in its writer process (bench/turn_overhead.py, stop 14: 1.5-2 ms off the
    #: turn's p50); PostgreSQL: no gain measured (stop 13).
    lazy_facts = False

    #: An attempt (connect and commit) is never cut sooner than this, however close the
    #: deadline of an append in it: a healthy commit under load must not be mistaken for a
    #: lost database (see `_attempt`).
    min_attempt_s = 0.5

    def __init__(self, engine: AsyncEngine, *, max_batch_events: int = 2000,
                 writers: int | None = None, append_timeout: float = 30.0,
                 attempt_timeout: float | None = None):
        check_count("max_batch_events", max_batch_events)
        check_count("writers", writers, none_ok=True)
        check_seconds("append_timeout", append_timeout)
        check_seconds("attempt_timeout", attempt_timeout, none_ok=True)
        self._engine = engine
        self._max_batch_events = max_batch_events
        self._append_timeout = append_timeout
        self._attempt_timeout = attempt_timeout
        self._queue = _RequestQueue()
        self._writer_count = writers or self.default_writers
        self._writers: list[asyncio.Task] = []
        self._closed = False
        self._changed = asyncio.Event()
        # Appends accepted and not yet returned (queued, committing, or about to go inline).
        self._inflight = 0
        # Appends committing from their own coroutine (`_append_direct`), and when none is.
        self._direct = 0
        self._no_direct = asyncio.Event()
        self._no_direct.set()
        self._seq = itertools.count()
        # stream id -> (version, last hash, epoch) as this store last committed or read it
        # under the write lock. Never trusted alone: see `_plan_from_cache`.
        self._heads: dict[str, tuple[int, str, int]] = {}
        # inline: commits on the caller's thread (SQLite); direct: from the appending
        # coroutine, through the writer (`_append_direct`); cached_plans: batches planned from
        # cached heads and written as planned; stale_heads: cached heads another writer moved.
        self.stats = {"batches": 0, "events": 0, "retries": 0, "inline": 0, "direct": 0,
                      "cached_plans": 0, "stale_heads": 0}

    # ------------------------------------------------------------------ lifecycle
    async def _start(self) -> None:
        await self._check_schema()
        await self._prepare_dialect()
        self._writers = [asyncio.create_task(self._writer_loop(), name=f"session-store-writer-{i}")
                         for i in range(self._writer_count)]

    async def _check_schema(self) -> None:
        try:
            async with self._connect() as conn:
                rows = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
        except (ProgrammingError, OperationalError) as exc:
            if "alembic_version" not in str(exc):
                raise StoreUnavailable(f"cannot reach the database: {exc}") from exc
            rows = []
        except DBAPIError as exc:
            # Reached, and refused: no such database or role, a login refused, a file that
            # is not SQLite. Not an outage.
            raise refused(exc) from exc
        found = [r[0] for r in rows]
        if not found:  # no alembic_version table, or an empty one (downgraded to base)
            raise SchemaMismatch(
                "the database has no session store schema; run `session-store migrate --db URL` "
                "(alembic upgrade head) first")
        if found == [HEAD_REVISION]:
            return
        check_known_revisions(found)
        raise SchemaMismatch(
            f"the database schema is at revision {found[0]}, older than this code's "
            f"{HEAD_REVISION}; run `session-store migrate --db URL` (alembic upgrade head)")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # An append accepted just before may be yielding before it commits inline or queues
        # in front (see `append`): let it, so it is never behind the stop sentinels.
        await asyncio.sleep(0)
        # A direct append hands a failed commit to the writer tasks: they must still run.
        await self._no_direct.wait()
        for _ in self._writers:
            self._queue.put_nowait(None)
        if self._writers:
            await asyncio.gather(*self._writers, return_exceptions=True)
        await self._close_dialect()
        await self._engine.dispose()

    @contextlib.asynccontextmanager
    async def _connect(self, *, begin: bool = False):
        """A pooled connection for reads (and snapshot writes). A database that is down
        gives StoreUnavailable naming the cause, as an append does, not the driver's own
        exception (a bare ConnectionRefusedError, a wrapped "the database system is starting
        up"), so callers can tell an outage from a bug."""
        try:
            async with (self._engine.begin() if begin else self._engine.connect()) as conn:
                yield conn
        except Exception as exc:  # noqa: BLE001 - sorted out below
            cause = self._outage_cause(exc)
            if cause is None:
                raise
            raise StoreUnavailable(f"cannot reach the database ({self._describe_outage(cause)})"
                                   ) from exc

    def _outage_cause(self, exc: BaseException) -> BaseException | None:
        """The driver's outage error behind `exc`, which SQLAlchemy may have wrapped (`orig`,
        and the asyncpg adapter's `__cause__`)."""
        orig = getattr(exc, "orig", None)
        for candidate in (exc, orig, getattr(orig, "__cause__", None)):
            if candidate is not None and not isinstance(candidate, StoreUnavailable) \
                    and self._is_outage(candidate):
                return candidate
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _prepare_dialect(self) -> None:
        """Dialect: set up before the writers start (a failure here opens nothing)."""

    async def _close_dialect(self) -> None:
        pass

    # ------------------------------------------------------------------ append
    async def append(self, stream_id: str, new_events: Sequence[Event], expected_version: int,
                     *, epoch: int | None = None, timeout: float | None = None,
                     recorded_at_us: int | None = None, urgent: bool = False) -> int:
        """Append events after `expected_version` (0 for a new stream); durable on return.

        Returns the stream's new version. Raises ConcurrencyConflict when the stream is not at
        `expected_version`, Fenced when `epoch` is older than the stream's epoch (a newer
        worker owns the call), StoreUnavailable when the database did not take the append
        within `timeout` seconds (default `append_timeout`): not acknowledged, and written
        only if the connection broke during its commit, so read the stream again before the
        next append (the CallDriver does). `recorded_at_us` stamps the events with the
        caller's clock instead of now: a writer that folds its own events (the service's
        CallDriver) then knows exactly what was stored without reading it back. `urgent`: the
        caller acts on the wire as soon as this commit returns (write-ahead on a latency
        path); a dialect may then commit it on the calling thread (SQLite, see its store).
        """
        if self._closed:
            raise StoreClosed("the store is closed")
        if not new_events:
            raise ValueError("append needs at least one event")
        rows = [(e.TYPE, e.SCHEMA, canonical_json(e.to_data())) for e in new_events]
        # Refused here, alone: queued, an append the database cannot store failed the whole
        # group commit it landed in (every other caller's append with it).
        _check_storable(stream_id, rows)
        if recorded_at_us is not None and not _is_bigint(recorded_at_us):
            # The hash covers str(recorded_at_us) and the column holds an integer: a float
            # (or a bool) was stored as another spelling than the one hashed, and the
            # acknowledged stream failed `verify` for good.
            raise TypeError(f"recorded_at_us must be a 64-bit int (microseconds), not "
                            f"{recorded_at_us!r:.40}")
        if epoch is not None and type(epoch) is not int:
            # The same rule on both databases, said before the append shares a commit:
            # SQLite stored a float (or a bool) epoch in the head row and fenced with it,
            # PostgreSQL refused the append. (Its range is the database's to refuse.)
            raise TypeError(f"epoch must be an int, not {epoch!r:.40}")
        loop = asyncio.get_running_loop()
        request = _AppendRequest(
            stream_id, rows, expected_version, epoch,
            now_us() if recorded_at_us is None else recorded_at_us,
            loop.time() + (self._append_timeout if timeout is None else timeout),
            seq=next(self._seq))
        self._inflight += 1
        try:
            front = False
            if self._may_commit_inline(stream_id, urgent):
                # Alone, and the store serves only this stream (the dialect's rule): commit
                # right here, after one loop turn. The commit holds the loop (an fsync):
                # whatever is ready to run goes first. In a live call that is the audio the
                # service pushed before the toolCall: without the turn it waited for both of
                # the call's commits (bench/turn_overhead.py, SQLite inline="urgent": audio
                # p50 +0.5 to +2.6 ms against stock; with it, -1.6 to +0.3), and a caller
                # appending in a tight loop would starve every other task. The turn costs the
                # tool call that processing: 0.2-0.8 ms of its p50 there.
                await asyncio.sleep(0)
                if self._may_commit_inline(stream_id, urgent):  # others may have come
                    outcome = self._append_inline(request)
                    if outcome is not None:
                        self._signal_change()
                        if isinstance(outcome, BaseException):
                            raise outcome
                        return outcome
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
                    self._signal_change()
                    if isinstance(outcome, BaseException):
                        raise outcome
                    return outcome
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
            self._forget_heads(batch)
            if self._lost(exc) and request.deadline <= asyncio.get_running_loop().time():
                return self._unavailable(exc)  # its time is up: another try cannot help it
            return None
        finally:
            self._direct -= 1
            if not self._direct:
                self._no_direct.set()
        self._remember_heads(batch, plan)
        self.stats["batches"] += 1
        self.stats["direct"] += 1
        self.stats["events"] += len(request.rows)
        return plan.outcomes[0]

    def _may_commit_inline(self, stream_id: str, urgent: bool) -> bool:
        """Is this append alone (nothing queued or committing) and may it go inline?"""
        return (self._inflight == 1 and self._queue.empty()
                and self._inline_ready(stream_id, urgent))

    def _inline_ready(self, stream_id: str, urgent: bool) -> bool:
        """Dialect: may an append to `stream_id` that finds the store idle commit on the
        calling thread? Asked at every such append (a dialect may track who appends)."""
        return False

    def _append_inline(self, request: _AppendRequest) -> Any:
        """Dialect: commit one request synchronously. Returns its outcome (new version or the
        error to raise), or None to hand it to the writers instead (nothing acknowledged)."""
        return None

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
            self.stats["batches"] += 1
            self.stats["events"] += sum(len(r.rows) for r in batch)
            self._signal_change()

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
            self._forget_heads(abandoned)  # (an earlier try of theirs may have committed)

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
                self._forget_heads(batch)
                self.stats["retries"] += 1
                continue
            except Exception as exc:  # noqa: BLE001 - sorted out below
                # Whatever happened, the database says next time what the heads are.
                self._forget_heads(batch)
                if not self._lost(exc) and len(batch) > 1:
                    # A row raced us past the head check, or one request holds what the
                    # database refuses: commit each request on its own, so one caller's
                    # problem does not fail the others (each gets its own outcome; a request
                    # that fails alone fails with its own error, and the rest still commit).
                    self.stats["retries"] += 1
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
                log.warning("append failed (%s); retrying in %.2fs", self._describe_outage(exc),
                            wait)
                self.stats["retries"] += 1
                await asyncio.sleep(max(wait, 0.0))
                delay = min(delay * 2, 1.0)
                continue
            self._remember_heads(batch, plan)
            for request, outcome in zip(batch, plan.outcomes):
                _settle(request, outcome)
            return

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"the database did not accept the append within its deadline "
            f"({self._describe_outage(exc)}); it was not acknowledged (if the connection broke "
            "during the commit it may still have been written: read the stream again before "
            "the next append)")

    async def _attempt(self, batch: list[_AppendRequest]) -> BatchPlan:
        """One try at committing a batch, abandoned at its earliest deadline or after
        `attempt_timeout` (if set), whichever comes first, but never before `min_attempt_s`.

        A database that crashes or restarts closes its sockets, and the attempt fails at
        once; a host behind a dead network says nothing, and a statement would wait as
        long as TCP lets it (minutes); a SQLite writer on a disk that stopped answering (or
        a stopped process) never answers. Either held every append of the batch past its
        deadline (and a service's receive loop with them). An abandoned attempt fails as an
        outage: the dialect makes sure it cannot commit later (`_attempt_abandoned`), the
        batch is retried under each append's own deadline, and a commit whose answer was
        lost is recognised by its hashes."""
        remaining = min(r.deadline for r in batch) - asyncio.get_running_loop().time()
        budget = max(remaining, self.min_attempt_s)
        if self._attempt_timeout is not None:
            budget = min(budget, self._attempt_timeout)
        try:
            async with asyncio.timeout(budget):
                return await self._run_batch(batch)
        except TimeoutError as exc:  # (or the driver's own, connecting: the same outage)
            self._attempt_abandoned()
            raise _NoAnswer(f"the database gave no answer within {budget:.2f}s") from exc

    def _attempt_abandoned(self) -> None:
        """Dialect: an attempt was cut (`_attempt`); make sure it cannot commit later."""

    def _lost(self, exc: BaseException) -> bool:
        """An outage (retry until the deadlines), as opposed to a bug (raise)."""
        return isinstance(exc, _NoAnswer) or self._is_outage(exc)

    async def _run_batch(self, batch: list[_AppendRequest]) -> BatchPlan:
        """Dialect: one transaction that plans (from the cache or the heads it reads under
        lock), writes, commits; returns the plan it committed."""
        raise NotImplementedError

    def _is_integrity_error(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def _insert(self, table):
        """Dialect: its INSERT construct (both support ON CONFLICT)."""
        raise NotImplementedError

    def _is_outage(self, exc: BaseException) -> bool:
        """Dialect: is this a lost/unreachable database (retry) rather than a bug (raise)?"""
        raise NotImplementedError

    def _describe_outage(self, exc: BaseException) -> str:
        """What went wrong, for StoreUnavailable and the log (dialects add detail)."""
        said = (str(exc).splitlines() or [''])[0]
        if not said and isinstance(exc, TimeoutError):
            said = "no answer in time"
        return f"{exc.__class__.__name__}: {said}"

    # ------------------------------------------------------------------ head cache
    def _plan_from_cache(self, batch: list[_AppendRequest]) -> BatchPlan | None:
        """Plan a batch from the cached heads, or None when the database must be asked.

        Only the plain case is planned here: every stream cached, every request at the cached
        version and epoch, no retry of an earlier attempt (whose outcome only the database
        knows). Errors (conflict, fenced) are always reported from heads read under lock.
        The writer then updates each head row only where it still equals `plan.before`; if
        any row moved, it rolls back and plans from the database (`plan.stale`).
        """
        heads = {}
        for r in batch:
            head = self._heads.get(r.stream_id)
            if head is None or r.final_hash is not None:
                return None
            heads[r.stream_id] = head
        plan = plan_batch(batch, heads)
        if plan.failed:
            self._unplan(batch)
            # Read these heads again: the caller may know better than the cache (a database
            # restored to an older state would otherwise keep them on the slow path).
            self._forget_heads(batch)
            return None
        plan.from_cache = True
        return plan

    @staticmethod
    def _unplan(batch: list[_AppendRequest]) -> None:
        """Forget the final hashes of a plan that was never written (it was rolled back)."""
        for r in batch:
            r.final_hash = None

    def _remember_heads(self, batch: list[_AppendRequest], plan: BatchPlan) -> None:
        """After a commit: cache the heads read under lock and the heads just written."""
        if plan.from_cache:
            self.stats["cached_plans"] += 1
        else:  # (a plan from the cache started from what is cached already)
            if plan.stale:
                self.stats["stale_heads"] += 1
                self._forget_heads(batch)
            for sid, head in plan.before.items():
                self._cache_head(sid, head)
        for row in plan.created:
            self._cache_head(row[0], (row[1], row[2], row[3]))
        for row in plan.updated:
            self._cache_head(row[0], (row[1], row[2], row[3]))

    def _cache_head(self, sid: str, head: tuple[int, str, int]) -> None:
        known = self._heads.pop(sid, None)
        if known is not None and known[0] > head[0]:
            head = known  # a later commit of ours (another writer task) got there first
        self._heads[sid] = head  # re-inserted: the dict's order is the eviction order
        if len(self._heads) > self.max_cached_heads:
            del self._heads[next(iter(self._heads))]

    def _forget_heads(self, batch: list[_AppendRequest]) -> None:
        for r in batch:
            self._heads.pop(r.stream_id, None)
