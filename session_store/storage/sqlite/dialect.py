"""SQLite: one writer at a time over the plain sqlite3 driver, WAL with synchronous=FULL.

The store's SQLite dialect: its committer (committer.py: the writer process, inline commits),
reads through SQLAlchemy over aiosqlite, and SQLite's answers to what the store asks
(dialect.py one level up). `sqlite_store(url)` makes an unopened store on it.

Opt-in (`inline="urgent"` or `"always"`): an append that finds the store idle commits inline
instead, on the event loop's thread over a second connection, where it stays small (inline.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import urllib.parse

from sqlalchemy import event, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from ...checks import check_seconds
from ..schema import events
from ..reads import InProcessOnly
from ..store import SqlEventStore
from .commit import configure
from .committer import SqliteCommitter
from .files import (ReadConnections, check_database_file, check_writable, database_path,
                    read_mode)


class SqliteDialect:
    """SQLite's part of a store (the `Dialect` protocol)."""

    name = "sqlite"
    default_writers = 1  # SQLite has one writer; more tasks would only queue on its lock
    poll_interval = 0.1  # other processes cannot notify us: poll
    lazy_facts = True  # see SqlEventStore.lazy_facts

    def __init__(self, url: str, *, inline: str = "never", inline_budget: float = 0.002,
                 read_only: bool = False):
        """`inline`: which appends that find the store idle, serving one stream, may commit
        on the event loop's thread: "never" (the default: every commit in the writer
        process), "urgent" ones (`append(urgent=True)`: an append the caller acts on at once,
        such as a tool's start or a result about to be sent), or "always". `inline_budget`:
        the longest inline commit (seconds) tolerated before inline commits pause (0.002
        suits a local SSD); 0 turns them off. `read_only`: no writer process, no appends;
        the file may be read-only, or in a read-only directory."""
        if inline not in ("urgent", "always", "never"):
            raise ValueError(f"inline must be 'urgent', 'always' or 'never', not {inline!r}")
        check_seconds("inline_budget", inline_budget, zero_ok=True)
        if inline == "never" or read_only:
            inline_budget = 0.0
        self._path = database_path(url)
        self.read_only = bool(read_only)
        # Reads open the file read-write, never create it (`mode=rw`, as the writer does): a
        # read connection opened after the database was removed created a new, empty one at
        # the path ("no such table" for every read and append after it) instead of failing
        # as an outage (SQLITE_CANTOPEN).
        self.engine = create_async_engine(make_url(url).set(
            database=f"file:{urllib.parse.quote(os.path.abspath(self._path))}"
        ).update_query_dict(read_mode(self._path, read_only)))
        event.listen(self.engine.sync_engine, "connect", lambda c, _r: configure(c))
        if read_only:  # (its mode decided per connection: files.py)
            reads = ReadConnections(self._path, read_only)
            event.listen(self.engine.sync_engine, "do_connect", reads.on_connect)
            event.listen(self.engine.sync_engine.pool, "checkout", reads.on_checkout)
        self.committer = SqliteCommitter(self._path, budget=inline_budget,
                                         urgent_only=inline == "urgent")
        self.commits_urgent_inline = inline_budget > 0

    async def open(self, check_schema) -> None:
        check_database_file(self._path)  # (not created here: `migrate` creates it)
        if self.read_only:
            await check_schema()
            return
        check_writable(self._path)
        # The writer process starts (0.15 s, mostly its imports) while the schema is checked.
        writer_started = asyncio.ensure_future(self.committer.start_writer())
        try:
            await check_schema()
        except BaseException:
            await asyncio.gather(writer_started, return_exceptions=True)
            raise
        await writer_started
        await self.committer.open_inline()

    async def close(self) -> None:
        await self.committer.close()

    def is_missing_table(self, exc: BaseException) -> bool:
        return "no such table" in str(getattr(exc, "orig", exc))

    def is_denied(self, exc: BaseException) -> bool:
        return False  # SQLite has no roles: a file it may not write is checked at open

    async def why_no_schema(self, conn) -> str | None:
        return None

    async def check_append_privileges(self, conn) -> None:
        """(No roles: `open` checked the file and its directory may be written.)"""

    def insert(self, table):
        return sqlite_insert(table)

    def global_order(self):
        # One writer at a time commits in position order (tx_order is always 0 here): the
        # global order is the primary key's. SQLite has no (tx_order, position) index
        # (migration 0002: it cost a quarter of every commit), so this must not sort by it.
        return (events.c.position,)

    def page_statement(self, columns, cursor, cursor_order, limit):
        return (select(*columns).where(events.c.position > cursor)
                .order_by(*self.global_order()).limit(limit))

    async def read_page(self, conn, stmt, params, limit):
        return (await conn.execute(stmt, params)).all()

    def change_notifications(self, on_change):
        return contextlib.nullcontext(InProcessOnly())


def sqlite_store(url: str, *, inline: str = "never", inline_budget: float = 0.002,
                 read_only: bool = False, **options) -> SqlEventStore:
    """An unopened store on the SQLite file at `url` (`open_store` opens it); `options` are
    the store's (`SqlEventStore`)."""
    return SqlEventStore(SqliteDialect(url, inline=inline, inline_budget=inline_budget,
                                       read_only=read_only), **options)
