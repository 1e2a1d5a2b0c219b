"""SQLite's committer: batches through the store's writer process, an idle store's append
inline on the event loop's thread when that is on, and what SQLite's errors mean.

SQLite has one writer at a time, so group commit here means one writer task that takes every
queued append into one transaction, committed by a writer process of the store's own
(writer.py: a thread would wait for the GIL of a busy event loop) with statements compiled
once from the Core tables (statements.py; commit.py commits, in the writer or inline).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3

from ...errors import CannotOpen, StoreFilesChanged, StoreUnavailable, driver_said, refused
from ..batch import BatchPlan, _AppendRequest
from ..group_commit import describe_outage
from .commit import FilesChanged
from .files import cannot_write
from .inline import InlineCommits
from .statements import compile_statements
from .writer import WriterProcess

log = logging.getLogger(__name__)

# What a database that cannot take writes for now answers (locked past busy_timeout, disk
# full, read-only, I/O error, cannot open): the append is retried until its deadline. Any
# other error (no such table, a constraint, ...) is a bug and raised at once.
_OUTAGE_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_NOMEM,
                           sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL,
                           sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL})


def _primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


class SqliteCommitter:
    """The group commit's `Committer` on SQLite; its `caller_commits` are the inline ones
    (inline.py), which a `budget` of 0 turns off."""

    def __init__(self, path: str, *, budget: float, urgent_only: bool):
        self._path = path
        self._statements = compile_statements()
        self._writer = WriterProcess(path, self._statements)
        self._reopening = asyncio.Lock()
        self._closed = False
        # What a connection found when the files changed under it (`FilesChanged`): from
        # then on every append is refused with it, whichever connection it would take.
        self._files_changed: str | None = None
        self._inline = InlineCommits(
            path, self._statements, self._writer, budget=budget, urgent_only=urgent_only,
            refuse=self._refuse_for_good, usable=lambda: self._files_changed is None)
        self.caller_commits = self._inline

    async def start_writer(self) -> None:
        """Start the writer process and open its connection: that sets WAL mode (persistent
        in the file) and may wait for a lock, which the loop must not."""
        try:
            await self._writer.start()
        except sqlite3.Error as exc:
            if _primary_code(exc) in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
                raise CannotOpen(cannot_write(self._path, driver_said(exc))) from exc
            if self.is_outage(exc):
                raise StoreUnavailable(f"cannot reach the database ({driver_said(exc)})"
                                       ) from exc
            raise refused(exc) from exc

    async def open_inline(self) -> None:
        """Open the inline connection (if inline commits are on), off the loop: it too may
        wait for a lock."""
        await asyncio.get_running_loop().run_in_executor(None, self._inline.open)

    def _refuse_for_good(self, exc: FilesChanged) -> StoreFilesChanged:
        if self._files_changed is None:
            self._files_changed = str(exc)
            log.error("%s", exc)
        return StoreFilesChanged(self._files_changed)

    async def run_batch(self, batch: list[_AppendRequest], cached: BatchPlan | None
                        ) -> BatchPlan:
        if self._files_changed is not None:
            raise StoreFilesChanged(self._files_changed)
        try:
            return await self._writer.commit(batch, cached)
        except FilesChanged as exc:
            raise self._refuse_for_good(exc) from None
        finally:
            if self._inline.broken() and not self._closed:
                async with self._reopening:  # (several writer tasks: one reopens)
                    try:  # the inline connection broke earlier: reopen it off the loop
                        await self.open_inline()
                    except (sqlite3.Error, FilesChanged):
                        log.warning("cannot reopen the inline SQLite connection",
                                    exc_info=True)

    def attempt_abandoned(self) -> None:
        self._writer.abandon()

    def is_outage(self, exc: BaseException) -> bool:
        if not isinstance(exc, sqlite3.OperationalError):
            return False
        code = _primary_code(exc)
        return code is None or code in _OUTAGE_CODES

    def describe_outage(self, exc: BaseException) -> str:
        name = getattr(exc, "sqlite_errorname", None)
        return f"{describe_outage(exc)}{f' ({name})' if name else ''}"

    async def close(self) -> None:
        self._closed = True
        try:
            await self._inline.close()
        finally:
            await self._writer.close()
