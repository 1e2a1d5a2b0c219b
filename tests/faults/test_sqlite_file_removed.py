"""A SQLite database file removed under a running store.

SQLite keeps writing to a file that was unlinked while open (and to its WAL): every commit
succeeds, into a file nobody will read again, gone when the process ends. Before stop 16 the
store acknowledged such appends (three in a row, in the first test below): acknowledged and
lost. Now each commit checks, before it is acknowledged, that the path still names the file
it wrote to.
"""

from __future__ import annotations

import os

import pytest

from session_store import StoreUnavailable
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
