"""What a database gives the store: `Dialect`, one object per open store.

`SqlEventStore` (store.py) is the one store class; it owns the dialect it is given and asks
it only what differs between databases: its engine, its committer (`Committer`,
group_commit.py: how one batch commits), how it opens and closes what it holds beyond the
pool, what its errors mean at open, and the few SQL differences reads have. Each package
(sqlite/, postgres/) is such a dialect: a committer and its statements, no store subclass.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from .group_commit import Committer


class Dialect(Protocol):
    """One database's part of a store."""

    name: str  # SQLAlchemy's dialect name ("sqlite", "postgresql")
    engine: AsyncEngine  # the pool reads (and snapshot writes) use

    @property
    def committer(self) -> Committer:  # (read-only: each dialect gives its own kind)
        """How the group commit commits a batch here."""
    read_only: bool  # opened to read: no appends, no snapshots, nothing that writes
    default_writers: int  # writer tasks when `writers` is not given
    poll_interval: float  # how often a follower reads again without a notification
    # Does a fact that decides nothing by itself gain by riding along with the next
    # append (`SqlEventStore.lazy_facts`)?
    lazy_facts: bool
    # May an urgent append commit on the caller's thread (`SqlEventStore.commits_urgent_inline`)?
    commits_urgent_inline: bool

    async def open(self, check_schema: Callable[[], Awaitable[None]]) -> None:
        """Open what the store needs beyond the pool, around `check_schema` (which it must
        await): an error opens nothing, and the store then calls `close`."""

    async def close(self) -> None:
        """Release what `open` and the committer hold (the pool is the store's)."""

    def is_missing_table(self, exc: BaseException) -> bool:
        """Does this error say a table does not exist?"""

    def is_denied(self, exc: BaseException) -> bool:
        """Does this error say the role may not use a table?"""

    async def why_no_schema(self, conn: AsyncConnection) -> str | None:
        """Why this database has no schema revision, where the database knows better than
        "run migrate" (raising CannotOpen if it is the role's rights); None otherwise."""

    async def check_append_privileges(self, conn: AsyncConnection) -> None:
        """CannotOpen if the store may read the tables but not append to them."""

    def insert(self, table) -> Any:
        """The dialect's INSERT construct (both have ON CONFLICT)."""

    def global_order(self) -> tuple:
        """The ORDER BY of the log's global order on this database."""

    def page_statement(self, columns: tuple, cursor, cursor_order, limit) -> Any:
        """`read_all`'s statement, built once: `columns` of at most `limit` rows after the
        cursor (the event at position `cursor`, in the global order at `cursor_order`)
        that a tailing reader may see, in the global order (`limit`, `cursor`: bound
        parameters)."""

    async def read_page(self, conn: AsyncConnection, stmt, params: dict, limit: int
                        ) -> list[tuple]:
        """The rows of `page_statement`'s `stmt` bound to `params` (`limit`: its page size)."""

    def change_notifications(self, on_change: Callable[[], None]
                             ) -> contextlib.AbstractAsyncContextManager:
        """For one follower: yields an object whose `listening()` says whether commits of
        other processes wake it (by calling `on_change`) or it must poll."""
