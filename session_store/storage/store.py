"""The event log over SQLAlchemy Core: `SqlEventStore`, the one store class, on any dialect.

`SqlEventStore` opens the log (the schema check), reads it (`LogReads`, reads.py), checks
each append and hands it to the group commit (group_commit.py), which plans batches from the
head cache (heads.py) when it can and commits them through the dialect's committer. What
differs between databases is the `Dialect` the store is given (dialect.py; one package per
database, sqlite/ and postgres/, each a committer and its statements): the store holds it,
and never subclasses per database.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import false, inspect, literal, select, text, union_all
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError

from ..checks import check_count, check_seconds
from ..errors import CannotOpen, SchemaMismatch, StoreUnavailable, driver_said, refused
from ..codec import out_of_range
from ..events import Event, canonical_json
from ..records import recorded_at_problem
from .schema import (HEAD_REVISION, check_known_revisions, check_stream_id, events, snapshots,
                      streams, unrecorded_revision)
from . import observers
from .batch import BatchPlan, Claim, _AppendRequest
from .group_commit import GroupCommit
from .heads import HeadCache
from .reads import LogReads, now_us

if TYPE_CHECKING:
    from .dialect import Dialect


def _check_storable(stream_id: str, rows: list[tuple[str, int, str]]) -> None:
    """ValueError for an append no database of ours can store: the same rule on both (SQLite
    took a stream id PostgreSQL refuses), and said before it shares a commit with others."""
    check_stream_id(stream_id)
    try:
        for _type, _schema, data_json in rows:
            data_json.encode()  # (canonical JSON escapes NUL; a lone surrogate stays)
    except UnicodeEncodeError as exc:
        raise ValueError(f"the append cannot be stored: it is not valid UTF-8 ({exc})") from None


def _is_bigint(value: Any) -> bool:
    return type(value) is int and -2 ** 63 <= value < 2 ** 63


async def _observed(append: Awaitable[int]) -> int:
    """An append timed for the process's observer (observers.py), its error reported too."""
    began = time.perf_counter()
    try:
        version = await append
    except BaseException as exc:
        if (observer := observers.observer) is not None:
            observer.appended(time.perf_counter() - began, exc)
        raise
    if (observer := observers.observer) is not None:
        observer.appended(time.perf_counter() - began, None)
    return version


class SqlEventStore(LogReads):
    """The log. Use `session_store.open_store(url)` to get one on the right dialect."""

    #: Stream heads kept in memory (most recently written); an evicted one is read again.
    max_cached_heads = 10_000

    def __init__(self, dialect: Dialect, *, max_batch_events: int = 2000,
                 writers: int | None = None, append_timeout: float = 30.0,
                 attempt_timeout: float | None = None):
        check_count("max_batch_events", max_batch_events)
        check_count("writers", writers, none_ok=True)
        check_seconds("append_timeout", append_timeout)
        check_seconds("attempt_timeout", attempt_timeout, none_ok=True)
        super().__init__(dialect)
        self.dialect_name = dialect.name
        #: May an `urgent` append commit on the caller's thread, with no hand-off (SQLite
        #: with inline commits on)? A caller may then keep its other appends out of its way.
        self.commits_urgent_inline = dialect.commits_urgent_inline
        #: Do lazy facts pay here: may a fact that decides nothing by itself (the send's
        #: confirmation, speech starting) wait to ride along with the next append, so that
        #: the log is free when a tool call comes? SQLite: yes, one commit at a time, off the
        #: event loop's GIL in its writer process (bench/turn_overhead.py: 1.5-2 ms off the
        #: turn's p50); PostgreSQL: no gain measured.
        self.lazy_facts = dialect.lazy_facts
        self._committer = dialect.committer
        self._append_timeout = append_timeout
        self._writer_count = writers or dialect.default_writers
        # inline: commits on the caller's thread (SQLite); direct: from the appending
        # coroutine, through the writer (`GroupCommit._append_direct`); cached_plans: batches
        # planned from cached heads and written as planned; stale_heads: cached heads another
        # writer moved.
        self.stats = {"batches": 0, "events": 0, "retries": 0, "inline": 0, "direct": 0,
                      "cached_plans": 0, "stale_heads": 0}
        self._heads = HeadCache(self.stats, self.max_cached_heads)
        self._commits = GroupCommit(self._committer, self._heads, self.stats,
                                    on_change=self._signal_change,
                                    max_batch_events=max_batch_events,
                                    attempt_timeout=attempt_timeout)

    # ------------------------------------------------------------------ lifecycle
    async def _open(self) -> None:
        """Check the schema, let the dialect open what it holds, start the writers; a
        failure releases everything taken so far."""
        try:
            await self._dialect.open(self._check_schema)
            if not self._read_only:
                self._commits.start(self._writer_count)
        except BaseException:
            await self._dialect.close()
            await self._engine.dispose()
            raise

    async def _check_schema(self) -> None:
        """SchemaMismatch unless the schema is this code's revision, CannotOpen unless this
        store's role may use its tables; one connection, at open."""
        try:
            async with self._connect() as conn:
                found = await self._revision(conn)
                if not found:
                    raise SchemaMismatch(await self._no_revision(conn))
                if found == [HEAD_REVISION]:
                    await conn.execute(union_all(*(  # (a role may be refused any of them)
                        select(literal(1)).select_from(table).where(false())
                        for table in (streams, events, snapshots))))
                    if not self._read_only:
                        await self._dialect.check_append_privileges(conn)
                    return
        except (ProgrammingError, OperationalError) as exc:
            if self._dialect.is_denied(exc):
                raise CannotOpen(
                    f"the database role may not use the session store's tables "
                    f"({driver_said(exc)}): grant it the right to read them (and to insert "
                    "and update, to append), or connect as the role that ran migrate") from exc
            raise StoreUnavailable(f"cannot reach the database ({driver_said(exc)})") from exc
        except DBAPIError as exc:
            # Reached, and refused: no such database or role, a login refused, a file that
            # is not SQLite. Not an outage.
            raise refused(exc) from exc
        check_known_revisions(found)
        raise SchemaMismatch(
            f"the database schema is at revision {found[0]}, older than this code's "
            f"{HEAD_REVISION}; run `session-store migrate --db URL` (alembic upgrade head)")

    async def _revision(self, conn) -> list[str]:
        """The revisions alembic_version holds: none if there is no such table."""
        try:
            return [r[0] for r in await conn.execute(
                text("SELECT version_num FROM alembic_version"))]
        except (ProgrammingError, OperationalError) as exc:
            if not self._dialect.is_missing_table(exc):
                raise
            await conn.rollback()  # (PostgreSQL: the failed statement ended the transaction)
            return []

    async def _no_revision(self, conn) -> str:
        """Why the database has no revision: no schema at all, or tables without one."""
        known = await self._dialect.why_no_schema(conn)
        if known is not None:
            return known
        if await conn.run_sync(lambda sync: inspect(sync).has_table(streams.name)):
            return unrecorded_revision()
        return ("the database has no session store schema; run `session-store migrate --db "
                "URL` (alembic upgrade head) first")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._signal_change()  # followers waiting for a change see the store closed
        await self._commits.close()  # (the appends accepted so far commit first)
        await self._dialect.close()
        await self._engine.dispose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # ------------------------------------------------------------------ append
    async def append(self, stream_id: str, new_events: Sequence[Event], expected_version: int,
                     *, epoch: int | None = None, timeout: float | None = None,
                     recorded_at_us: int | None = None, urgent: bool = False,
                     unfenced: bool = False) -> int:
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
        path); a dialect may then commit it on the calling thread (SQLite: sqlite/dialect.py).
        Without an `epoch`, an append to a stream taken over (epoch 2 or more) is Fenced
        unless `unfenced` says it goes in whichever worker owns the call.
        """
        request = self._request(stream_id, new_events, expected_version, epoch, timeout,
                                recorded_at_us)
        request.unfenced = bool(unfenced) and epoch is None
        if observers.observer is not None:
            return await _observed(self._commits.submit(request, urgent))
        return await self._commits.submit(request, urgent)

    async def take_over(self, stream_id: str, new_events: Sequence[Event], epoch: int, *,
                        after_version: int, timeout: float | None = None,
                        recorded_at_us: int | None = None) -> int:
        """Append events at the stream's head, whatever its version, raising its fencing
        epoch to `epoch`: a takeover that an old worker appending as fast as it can never
        starves (an append at an expected version lost every race to it).

        `after_version`: the version the caller has read up to. Appends the old worker
        committed before this one stay (versions after_version + 1 up to the returned
        version - len(new_events)): read them before acting. Every append with an older
        epoch after it is Fenced. Returns the stream's new version. Raises Fenced when the
        stream's epoch is already `epoch` or more (another worker took over first: read
        again, and take over with a higher epoch), CallClosed when a session.closed was
        stored after `after_version`, ConcurrencyConflict when the stream is not even at
        `after_version` (its events end before what the caller read), StoreUnavailable as
        `append` does.
        """
        if type(epoch) is not int or epoch < 1:
            raise ValueError(f"a takeover needs an int epoch of 1 or more, not {epoch!r:.40}")
        if type(after_version) is not int or after_version < 0:
            raise ValueError(f"after_version must be an int of 0 or more, not "
                             f"{after_version!r:.40}")
        request = self._request(stream_id, new_events, after_version, epoch, timeout,
                                recorded_at_us)
        request.claim = Claim(after_version)
        if observers.observer is not None:
            return await _observed(self._commits.submit(request, urgent=False))
        return await self._commits.submit(request, urgent=False)

    def _request(self, stream_id: str, new_events: Sequence[Event], expected_version: int,
                 epoch: int | None, timeout: float | None,
                 recorded_at_us: int | None) -> _AppendRequest:
        """An append checked for what every database refuses, before it shares a commit."""
        self._check_open()
        self._check_writable()
        if not new_events:
            raise ValueError("append needs at least one event")
        rows = []
        for e in new_events:
            data = e.to_data()
            wrong = out_of_range(type(e), data)
            if wrong:  # (every reader would refuse the event: `decode`)
                raise ValueError(f"{e.TYPE}: {wrong}")
            rows.append((e.TYPE, e.SCHEMA, canonical_json(data)))
        # Refused here, alone: queued, an append the database cannot store failed the whole
        # group commit it landed in (every other caller's append with it).
        _check_storable(stream_id, rows)
        if recorded_at_us is not None and not _is_bigint(recorded_at_us):
            # The hash covers str(recorded_at_us) and the column holds an integer: a float
            # (or a bool) was stored as another spelling than the one hashed, and the
            # acknowledged stream failed `verify` for good.
            raise TypeError(f"recorded_at_us must be a 64-bit int (microseconds), not "
                            f"{recorded_at_us!r:.40}")
        if recorded_at_us is not None and recorded_at_problem(recorded_at_us):
            raise ValueError(recorded_at_problem(recorded_at_us))
        if epoch is not None and type(epoch) is not int:
            # The same rule on both databases, said before the append shares a commit:
            # SQLite stored a float (or a bool) epoch in the head row and fenced with it,
            # PostgreSQL refused the append. (Its range is the database's to refuse.)
            raise TypeError(f"epoch must be an int, not {epoch!r:.40}")
        loop = asyncio.get_running_loop()
        return _AppendRequest(
            stream_id, rows, expected_version, epoch,
            now_us() if recorded_at_us is None else recorded_at_us,
            loop.time() + (self._append_timeout if timeout is None else timeout))
