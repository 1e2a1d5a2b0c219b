"""A SQLite database file removed under a running store.

SQLite keeps writing to a file that was unlinked while open (and to its WAL): every commit
succeeds, into a file nobody will read again, gone when the process ends. Before stop 16 the
store acknowledged such appends (three in a row, in the first test below): acknowledged and
lost. Now each commit checks, before it is acknowledged, that the path still names the file
it wrote to.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from session_store import SchemaMismatch, StoreUnavailable, open_store
from session_store.events import BotStartedSpeaking
from tests.service.helpers import migrated_sqlite


def _event(n: int = 1) -> BotStartedSpeaking:
    return BotStartedSpeaking(generation=n)


@pytest.mark.parametrize("inline", ["never", "always"])
async def test_appends_after_the_file_was_removed_are_never_acknowledged(tmp_path, inline):
    path = tmp_path / "log.db"
    async with migrated_sqlite(path, inline=inline) as store:
        v = await store.append("call", [_event()], 0)
        os.unlink(path)
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                await store.append("call", [_event()], v, timeout=0.5)
    assert not path.exists(), "the store created an empty database where the old one was"


async def test_reads_after_the_file_was_removed_never_create_an_empty_database(tmp_path):
    """Reads go through their own connections (a pool): a new one opened after the removal
    created a new, empty database at the path (SQLite's default open mode), answered
    "no such table" (a bare OperationalError, not an outage), and the appends after it
    failed the same way, at once, instead of as an outage until their deadline."""
    path = tmp_path / "log.db"
    async with migrated_sqlite(path) as store:
        v = await store.append("call", [_event()], 0)
        os.unlink(path)
        # Several at once: the pool opens new connections for them.
        results = await asyncio.gather(*(store.read("call") for _ in range(4)),
                                       store.stream_version("call"), store.read_all(),
                                       return_exceptions=True)
        assert not path.exists(), "a read created an empty database where the old one was"
        for result in results:
            if isinstance(result, BaseException):
                assert isinstance(result, StoreUnavailable), repr(result)
        with pytest.raises(StoreUnavailable):
            await store.append("call", [_event()], v, timeout=0.5)
    assert not path.exists()


async def test_a_store_opened_on_a_missing_file_says_what_to_run_and_creates_nothing(tmp_path):
    path = tmp_path / "log.db"
    with pytest.raises(SchemaMismatch, match="session-store migrate"):
        await open_store(f"sqlite+aiosqlite:///{path}")
    assert not path.exists(), "opening a store created an empty database"
