"""A reader that cannot write the database's directory (issue #34, item 4): the normal set-up
of a viewer or `tail` running as its own user.

With no -wal next to the file at that moment (the bots' store closed cleanly), such a reader
opened it `immutable` (SQLite could not create the -shm a WAL reader needs) and never saw a
later write: `tail` printed 0 of 20 events appended afterwards, and no error. It now follows:
a read connection opened immutable is replaced once the file changed, by a plain read-only
one when the writer's -wal and -shm are there.

Runs `tail` as the user `nobody` (setpriv), the writer as this test's user (root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from session_store import events as ev
from session_store import open_store
from session_store.storage.migrate import upgrade

EVENTS = 20


def _nobody() -> int:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to run the reader as another user")
    try:
        uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody")
    # The checkout and its virtualenv must be readable by that user (a clone in a 0700
    # directory is not: .ci/run opens its checkout to others for this test).
    probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                            sys.executable, "-c", "import session_store.commands.cli"],
                           capture_output=True, text=True, cwd="/")
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run this checkout's Python: {probe.stderr.strip()[-200:]}")
    return uid


@pytest.fixture
def shared_dir():
    """A directory others may read but not write (not under pytest's 0700 tmp)."""
    path = Path(tempfile.mkdtemp(prefix="reader-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_tail_as_a_user_who_cannot_write_the_directory_sees_every_later_event(
        shared_dir):
    uid = _nobody()
    url = f"sqlite+aiosqlite:///{shared_dir / 'sessions.db'}"
    await upgrade(url)
    store = await open_store(url)
    v = await store.append("c", [ev.SessionOpened("m", [], "w1", 1)], 0, epoch=1)
    await store.close()
    assert not (shared_dir / "sessions.db-wal").exists()
    (shared_dir / "sessions.db").chmod(0o644)

    tail = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
         "-m", "session_store.commands.cli", "tail", "c", "--db", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200", "HOME": "/tmp"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(tail.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline and tail.poll() is None:
            time.sleep(0.05)  # (tail shows the call's last events first: it has started)
        assert lines, f"tail showed nothing: {tail.stderr.read() if tail.poll() else ''}"
        store = await open_store(url)
        try:
            for i in range(EVENTS):
                v = await store.append("c", [ev.ConversationMessage("user", f"late {i}", 1)],
                                       v, epoch=1)
            await store.append("c", [ev.SessionClosed("ended")], v, epoch=1)
            tail.wait(timeout=30)  # (a followed call ends the tail when it closes)
        finally:
            await store.close()
    finally:
        if tail.poll() is None:
            tail.kill()
        tail.wait()
        reader.join(5)
    err = tail.stderr.read()
    seen = [i for i in range(EVENTS) if any(f"late {i}" in line for line in lines)]
    assert tail.returncode == 0 and len(seen) == EVENTS, (
        f"tail saw {len(seen)} of {EVENTS} later events, exit {tail.returncode}: {err[-500:]}")
