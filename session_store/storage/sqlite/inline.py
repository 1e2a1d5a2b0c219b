"""SQLite's inline commits: an idle store's append committed on the event loop's thread.

Opt-in (`inline="urgent"` or `"always"`): an append that finds the store idle (nothing
queued or committing) commits inline instead, on the event loop's thread over a second
connection: on a fast disk the two process hand-offs of the writer path cost more than the
commit itself (bench/append_floor.py). "urgent" does this
only for appends marked urgent (the service marks the two a tool call waits for: its start,
its result with the send intent). Inline blocks the loop, and the audio of every call on it,
for each fsync, so it is off by default: through the writer a disk that stalls delays a
tool call, inline it would stall the audio of every call on the loop. An inline commit
first gives the loop one turn (the store's append), so the audio already pushed goes out
before the loop blocks. "always" suits a process that appends for one stream and has nothing
else on its loop. Where it is on, it is only used where the stall stays small:
- while the store serves one stream (one call): if another stream was appended to in the last
  `_SHARED_QUIET_S`, every append goes to the writer. With n calls on a loop, inline
  commits would come n times as often and each would hold up n calls' audio; group commit in
  the writer keeps fsyncs off the loop (bench/concurrent_calls.py);
- that connection never waits for SQLite's lock (busy_timeout=0): if another process holds
  it, the append goes to the writer, which waits;
- it never checkpoints the WAL (wal_autocheckpoint=0); the writer does, every
  `_CHECKPOINT_EVERY` inline commits, and appends go to the writer (queued behind the
  checkpoint) until it is done: a checkpoint racing a stream of commits never catches up, the
  WAL file then grows without end and every fsync gets slower;
- commits slower than `inline_budget` seconds (a slow or busy disk) stop inline commits for a
  while (1 s, doubling while it stays slow, at most 60 s): two within 13 commits, or one ten
  times over budget. A single slow fsync is noise on a shared machine; a disk that is
  slow every time is not.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable

from ..batch import BatchPlan, _AppendRequest
from .commit import CommitConnection, FilesChanged, Statements, commit_batch, connect
from .watch import FileWatch
from .writer import WriterProcess

log = logging.getLogger(__name__)

# Inline commits between two WAL checkpoints (by the writer). One event dirties ~4 pages,
# so this is about SQLite's own default of 1000 WAL pages.
CHECKPOINT_EVERY = 250
PAUSE_MIN_S, PAUSE_MAX_S = 1.0, 60.0
# Per inline commit an old slow commit counts less: two slow ones within 13 commits pause.
SLOW_DECAY = 0.95
SLOW_LIMIT = 1.5
FAST_RUN_RESET = 200  # this many commits in budget in a row: the pause starts at 1 s again
SHARED_QUIET_S = 1.0  # another stream appended to this recently: the store is shared


def _is_busy(exc: BaseException) -> bool:
    return (isinstance(exc, sqlite3.OperationalError)
            and getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY)


class InlineCommits:
    """The store's inline connection and when to use it (the group commit's
    `CallerCommits`). `budget` 0: never (no connection is opened)."""

    def __init__(self, path: str, statements: Statements, writer: WriterProcess, *,
                 budget: float, urgent_only: bool, refuse: Callable[[FilesChanged], Exception],
                 usable: Callable[[], bool]):
        self._path, self._statements, self._writer = path, statements, writer
        self.budget = budget
        self._urgent_only = urgent_only
        self._refuse = refuse  # files changed under a connection: the store's error for good
        self._usable = usable  # the store is open and its files are as they were
        self.conn: CommitConnection | None = None  # the event loop thread's
        self._files: FileWatch | None = None  # its files' content, across its connections
        self.paused_until = 0.0
        self.pause = PAUSE_MIN_S
        self._slow_score = 0.0
        self._fast_run = 0
        self._last_stream: str | None = None
        self._last_stream_at = 0.0
        self.shared_until = 0.0
        self._since_checkpoint = 0
        self.checkpointing = False
        self._checkpoint_task: asyncio.Task | None = None

    def open(self) -> None:
        """(Off the loop: it may wait for SQLite's lock.)"""
        if self.budget > 0 and self.conn is None:
            if self._files is None:
                self._files = FileWatch(self._path)
            self.conn = connect(self._path, self._statements, busy_timeout_ms=0,
                                checkpoints=False, watch=self._files)

    def broken(self) -> bool:
        """Is the connection gone while inline commits are on (to be opened again)?"""
        return self.conn is None and self.budget > 0

    def ready(self, stream_id: str, urgent: bool) -> bool:
        now = time.monotonic()
        if stream_id != self._last_stream:
            if now - self._last_stream_at < SHARED_QUIET_S:
                self.shared_until = now + SHARED_QUIET_S  # several calls: keep off the loop
            self._last_stream = stream_id
        self._last_stream_at = now
        if self._urgent_only and not urgent:
            return False
        return (self.conn is not None and not self.checkpointing
                and now >= self.paused_until and now >= self.shared_until and self._usable())

    def commit(self, request: _AppendRequest, cached: BatchPlan | None
               ) -> BatchPlan | BaseException | None:
        conn = self.conn
        if conn is None:  # (`ready` asked first: not while it is closed)
            return None
        started = time.monotonic()
        try:
            plan = commit_batch(conn, self._statements, [request], cached)
        except FilesChanged as exc:
            return self._refuse(exc)
        except Exception as exc:  # noqa: BLE001 - the writer retries and reports it
            if _is_busy(exc):  # another process writes: leave the lock to the writer
                self.paused_until = time.monotonic() + 0.05
            else:
                log.warning("inline commit failed (%s); handing over to the writer", exc)
                self.conn = None  # reopened after the writer's next batch
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            return None
        self.judge(time.monotonic() - started)
        self._since_checkpoint += 1
        if self._since_checkpoint >= CHECKPOINT_EVERY and not self.checkpointing:
            self._since_checkpoint = 0
            self.checkpointing = True
            self._checkpoint_task = asyncio.ensure_future(self._checkpoint())
        return plan

    def judge(self, took: float) -> None:
        """Pause inline commits when they keep blocking the loop longer than the budget."""
        budget = self.budget
        slow = (took > budget) + (took > 10 * budget)
        self._slow_score = self._slow_score * SLOW_DECAY + slow
        if not slow:
            self._fast_run += 1
            if self._fast_run >= FAST_RUN_RESET:
                self.pause = PAUSE_MIN_S
            return
        self._fast_run = 0
        if self._slow_score >= SLOW_LIMIT:
            self._slow_score = 0.0
            self.paused_until = time.monotonic() + self.pause
            log.info("inline commits over budget (last %.1f ms, budget %.1f ms): the writer "
                     "for %.0f s", took * 1e3, budget * 1e3, self.pause)
            self.pause = min(self.pause * 2, PAUSE_MAX_S)

    async def _checkpoint(self) -> None:
        try:
            await self._writer.checkpoint()
        except FilesChanged as exc:
            self._refuse(exc)
        except Exception:  # noqa: BLE001 - the next one retries
            log.warning("WAL checkpoint failed; the next one retries", exc_info=True)
        finally:
            self.checkpointing = False

    def _close_conn(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()
        if self._files is not None:
            self._files.close()
            self._files = None

    async def close(self) -> None:
        if self._checkpoint_task is not None:
            await asyncio.gather(self._checkpoint_task, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self._close_conn)
