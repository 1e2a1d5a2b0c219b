"""Hostile values and damaged files that crashed readers instead of erring (issue #34, items 6
and 7): a time no date can show, ints the log never writes, a malformed SQLite file, an
empty one. Each gets one line naming what is wrong (the event: stream, version, type), and
`verify` goes on with the rest of the database. The payload kinds (1e400, a generation of
-5 or 10**40, an attempt of 10**20, a second session.opened) run through every reader in
tests/faults/test_hostile_storage.py (HOSTILE).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

from session_store import events as ev
from session_store import load_state
from session_store.errors import CorruptEvent
from session_store.audit.verify import verify_log
from tests.store.helpers import insert_raw_event, sql
from tests.tools.helpers import T0, acli, one_line_error, streamed_then_error, support_call, write_call

N = 24  # events of a call before its bad row (support_call() without its close)
TIMES = {"time-max": 2**63 - 1, "time-negative": -2**62}


@pytest.fixture
async def timed_log(migrated):
    """A good call, and one call per hostile time: N good events, then the row."""
    await write_call(migrated, "good", support_call()[:N], T0)
    for call, at_us in TIMES.items():
        await write_call(migrated, call, support_call()[:N], T0)
        await insert_raw_event(migrated, call, "conversation.message", 1,
                               '{"generation":3,"role":"user","text":"when?"}', at_us=at_us)
    return migrated


async def test_a_time_no_date_can_show_is_named_by_every_reader(timed_log, store):
    """2**63-1 and -2**62 crashed `state`, `export` and `tail` (OverflowError) while verify
    said ok."""
    reports = {r.stream_id: r for r in await verify_log(store)}
    assert reports["good"].ok and reports["good"].events_checked == N
    for call, at_us in TIMES.items():
        assert (reports[call].ok, reports[call].first_bad_version) == (False, N + 1), call
        assert f"recorded_at_us {at_us} is outside 1970 to 9999" in reports[call].reason
        with pytest.raises(CorruptEvent, match=f"{call}@{N + 1}"):
            (await store.read(call))[-1].recorded_at  # noqa: B018 - reading it checks it
        for command in (["state", call], ["timeline", call]):
            one_line_error(await acli(*command, backend=timed_log), f"{call}@{N + 1}",
                           "outside 1970 to 9999")
        # export streams: the events before the bad one are out before it is read
        streamed_then_error(await acli("export", call, backend=timed_log), f"{call}@{N + 1}",
                            "outside 1970 to 9999")
        # tail shows the last events first: it errs in one line too (and ends).
        done = subprocess.run([sys.executable, "-m", "session_store.commands.cli", "tail", call,
                               *timed_log.cli_args], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "COLUMNS": "200"})
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"{call}@{N + 1}" in done.stderr and "outside 1970 to 9999" in done.stderr
    verify = await acli("verify", backend=timed_log)
    assert verify.exit_code == 1 and "ok   good: 24 events" in verify.stdout, verify.output
    calls = await acli("calls", backend=timed_log)
    assert calls.exit_code == 0, calls.output


async def test_the_store_refuses_what_every_reader_would_refuse(store):
    """The same bounds on the way in: nothing is written."""
    for bad in (ev.Connected(-5), ev.Connected(10**40), ev.SessionOpened("m", [], "w", -1)):
        with pytest.raises(ValueError, match="outside the 0 to 2\\^63-1"):
            await store.append("c", [bad], 0)
    for at_us in TIMES.values():
        with pytest.raises(ValueError, match="outside 1970 to 9999"):
            await store.append("c", [ev.Connected(1)], 0, recorded_at_us=at_us)
    with pytest.raises(ValueError, match="not JSON|Out of range|NaN|inf"):
        await store.append("c", [ev.GoAwayReceived(1, float("inf"))], 0)
    assert await store.stream_version("c") == 0


def _damage_page_of(path: str, marker: bytes) -> None:
    """Garbage over the b-tree page header of the page holding `marker`."""
    data = open(path, "rb").read()
    page = 4096
    at = data.index(marker) // page * page
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\xee" * 16)


async def test_a_malformed_sqlite_database_errs_in_one_line_and_verify_goes_on(tmp_path):
    """A damaged page gave an SQLAlchemy traceback in `verify` and `calls`."""
    from tests.conftest import empty_database

    async with empty_database("sqlite", tmp_path) as backend:
        await backend.migrate()
        long = "x" * 3000
        calls = {"a-damaged": "MARKER-A", "b-fine": "MARKER-B"}
        for call, marker in calls.items():
            await write_call(backend, call, [
                (0, ev.SessionOpened("gemini-live", [], "w1", 1)),
                *((i, ev.ConversationMessage("user", f"{marker} {i} {long}", 1))
                  for i in range(1, 8))])
        path = str(tmp_path / "log.db")
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        _damage_page_of(path, b"MARKER-A 4")

        verify = await acli("verify", backend=backend)
        assert "Traceback" not in verify.output and verify.exit_code == 1, verify.output
        assert "BAD  a-damaged" in verify.stdout and "malformed" in verify.stdout
        assert "ok   b-fine: 8 events" in verify.stdout
        one_line_error(await acli("state", "a-damaged", backend=backend), "malformed")
        streamed_then_error(await acli("export", "a-damaged", backend=backend), "malformed")


async def test_verify_of_an_empty_file_says_what_it_is_and_not_to_migrate(tmp_path):
    """`verify` on a 0-byte file advised `migrate`, which would bury the evidence."""
    path = tmp_path / "sessions.db"
    path.write_bytes(b"")
    for command in ("verify", "calls"):
        one_line_error(await acli(command, "--db", str(path)), "is empty (0 bytes",
                       "truncated", unsaid=("run `session-store migrate",))
    assert path.stat().st_size == 0
