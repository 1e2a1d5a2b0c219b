"""SQLite: WAL checkpoints run while the log is idle, not inside an append's commit.

SQLite's automatic checkpoint runs inside the commit that crosses its threshold (1,000 pages
by default): that append, often a tool call's write-ahead commit, waits for the copy of the
WAL into the database and its fsync (median 1.3 ms, up to 7 ms here, once every ~220
commits: in a call, about one tool call in 40). The writer process checkpoints instead
when no request has come for a moment, and after the commit that brings the WAL to
SQLite's threshold when it never idles (SQLite's own is off), so the WAL stays bounded.

What the WAL holds is read from the wal-index header in the -shm file (its layout:
https://www.sqlite.org/walformat.html): `mxFrame`, the last valid frame, and `nBackfill`,
the frames already copied into the database.
"""

from __future__ import annotations

import asyncio
import os
import struct

import pytest

from session_store.storage.sqlite.child import IDLE_CHECKPOINT_AFTER

from ..helpers import msg


@pytest.fixture
async def sqlite_path(migrated):
    return migrated.url.split("///", 1)[1]


def wal_frames(path: str) -> tuple[int, int]:
    """(mxFrame, nBackfill) of the database's WAL, from its wal-index header."""
    with open(path + "-shm", "rb") as shm:
        header = shm.read(100)
    mx_frame = struct.unpack_from("=I", header, 16)[0]
    n_backfill = struct.unpack_from("=I", header, 96)[0]
    return mx_frame, n_backfill


def commits_in_frames(path: str, first: int, last: int) -> int:
    """How many commits end in WAL frames first..last (1-based): a frame whose header's
    second field (the database size after the commit) is not zero ends one."""
    with open(path + "-wal", "rb") as wal:
        page_size = struct.unpack(">I", wal.read(32)[8:12])[0]
        commits = 0
        for frame in range(first, last + 1):
            wal.seek(32 + (frame - 1) * (24 + page_size))
            commits += struct.unpack(">II", wal.read(8))[1] != 0
    return commits


async def test_an_idle_log_is_checkpointed_by_the_writer(migrated, sqlite_path):
    store = await migrated.open()
    try:
        version = 0
        for i in range(100):  # ~450 pages: below SQLite's own threshold of 1,000
            version = await store.append("s", [msg(i)], version)
        await asyncio.sleep(0.3)  # idle
        mx_frame, n_backfill = wal_frames(sqlite_path)
        assert mx_frame > 0, "the appends went elsewhere than the WAL"
        # Back to back, the 100 commits wait for the idle moment and all are checkpointed.
        # On a loaded machine the appends come more than IDLE_S apart, the writer
        # checkpoints each time IDLE_CHECKPOINT_AFTER commits wait, and the last few (fewer
        # than that) wait for the next ones: the rule, not "every frame", is what holds.
        waiting = commits_in_frames(sqlite_path, n_backfill + 1, mx_frame)
        assert waiting < IDLE_CHECKPOINT_AFTER, (
            f"{waiting} commits ({mx_frame - n_backfill} of {mx_frame} WAL frames) not "
            "checkpointed while idle")
    finally:
        await store.close()


async def test_a_log_that_never_idles_keeps_a_bounded_wal(migrated, sqlite_path):
    store = await migrated.open()
    try:
        version = 0
        for i in range(1500):  # back to back: no idle moment for the writer
            version = await store.append("s", [msg(i)], version)
        wal = os.path.getsize(sqlite_path + "-wal")
        assert wal < 12_000_000, f"WAL grew to {wal / 1e6:.1f} MB"
    finally:
        await store.close()
