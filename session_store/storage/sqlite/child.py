"""The SQLite writer process itself: run as `python -m session_store.storage.sqlite.child`
by the store's `WriterProcess` (writer.py), it commits what the store sends it.

Protocol: frames of a 4-byte little-endian length and a pickle; requests on the child's
stdin, answers on a pipe of their own (fd in argv: nothing the child prints can get in). A
request is (id, op, args); the answer is (id, status, result, planned), status "ok" or
"error", `planned` each request's (final hash, version it went after); before it, for a
batch planned in the child (heads read under the write lock, not from the parent's cache),
(id, "planned", None, planned) is sent before the commit: a batch whose answer is lost (the
child died) is recognised on its retry by those hashes (see `plan_batch`), as with a lost
acknowledgement. A batch committed as the parent planned it is
answered with None (the parent has the plan and its hashes).

WAL checkpoints run in the child while the log is idle (`IDLE_CHECKPOINT_AFTER` commits
waiting, no request for `IDLE_S`): SQLite's automatic checkpoint runs inside the commit that
crosses its threshold, and that append (often a tool call's write-ahead commit) waited for the
WAL's copy into the database and its fsync, about a millisecond, up to 7 (bench/README.md).
A log that never idles is checkpointed after the commit that brings it to
`BACKSTOP_FRAMES`, as SQLite's own checkpoint would (which the connection leaves off: it
would run inside the commit, where the file watch cannot tell its writes from others').

The child dies with its parent (PR_SET_PDEATHSIG on Linux; strictly, with the thread that
started it, which is the event loop's): a worker killed mid-call takes its uncommitted batch
with it, as a thread would, and never writes after its own end.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sqlite3
import struct
import sys
from typing import Any

from ..batch import _AppendRequest
from . import watch
from .commit import (CommitConnection, FilesChanged, Statements, checkpoint, commit_batch,
                     connect)

HEADER = struct.Struct("<I")
#: Checkpoint the WAL once this many commits wait in it and no request has come for IDLE_S
#: seconds (a few hundred pages: one such checkpoint takes about a millisecond here).
IDLE_CHECKPOINT_AFTER = 32
IDLE_S = 0.004
#: Checkpoint after a commit that leaves this many WAL frames (SQLite's default threshold).
BACKSTOP_FRAMES = 1000


def frame(obj: Any) -> bytes:
    """One message of the protocol (either way): its length, then its pickle."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def _planned(batch: list[_AppendRequest]) -> list[tuple[str | None, int]]:
    """What the parent must know of a plan made here, even if no answer follows: each
    request's final hash and the version it went after (a takeover's is the head's)."""
    return [(r.final_hash, r.expected_version) for r in batch]


def _error_payload(exc: BaseException) -> tuple:
    if isinstance(exc, FilesChanged):
        return ("files", type(exc).__name__, str(exc), None, None)
    if isinstance(exc, sqlite3.Error):
        return ("sqlite3", type(exc).__name__, str(exc), getattr(exc, "sqlite_errorcode", None),
                getattr(exc, "sqlite_errorname", None))
    return ("other", type(exc).__name__, str(exc), None, None)


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def _read_exactly(fd: int, size: int) -> bytes:
    """`size` bytes from the requests pipe, or fewer if the parent closed it. (Read unbuffered:
    `_request_within` asks the pipe itself whether a request waits, which a buffered reader
    could already have taken in.)"""
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _request_within(fd: int, seconds: float) -> bool:
    """Does a request come (or the pipe close) within `seconds`?"""
    return bool(select.select([fd], [], [], seconds)[0])


def _serve(requests: int, replies) -> None:
    # Set by the first request ("open"), which the parent sends before any other.
    path: str | None = None
    statements: Statements | None = None
    conn: CommitConnection | None = None
    traced: list[str] | None = None  # statements run, while a test traces them
    commits_since_checkpoint = 0
    # The files changed under the connection: every request after it fails the same way
    # (a new connection would commit to whatever the path names now).
    files_changed: FilesChanged | None = None
    files = None  # the FileWatch of the database's files, across this process's connections
    while True:
        if (conn is not None and commits_since_checkpoint >= IDLE_CHECKPOINT_AFTER
                and not _request_within(requests, IDLE_S)):
            # Idle: checkpoint now, not inside the commit that crosses SQLite's threshold
            # (module docstring). A request that comes meanwhile waits for it.
            commits_since_checkpoint = 0
            try:
                checkpoint(conn)
            except sqlite3.Error:
                pass  # (the next idle moment, or the backstop, tries again)
            except FilesChanged as exc:
                files_changed = exc
        header = _read_exactly(requests, HEADER.size)
        if len(header) < HEADER.size:
            return  # the parent closed the pipe: done
        rid, op, args = pickle.loads(_read_exactly(requests, HEADER.unpack(header)[0]))
        batch: list[_AppendRequest] = []
        result: Any
        reply: tuple[Any, ...]
        try:
            if files_changed is not None:
                raise files_changed
            if op == "open":
                path, statements = args
                files = watch.FileWatch(path)
                conn = connect(path, statements, watch=files)
                result = None
            else:
                # (opened first)
                assert path is not None and statements is not None and files is not None
                if conn is None:  # dropped after a failure: a new connection each try
                    conn = connect(path, statements, watch=files)
                    conn.set_trace_callback(None if traced is None else traced.append)
                if op == "commit":
                    rows, cached = args
                    batch = [_AppendRequest(s, r, v, e, t, 0.0, final_hash=h, claim=c,
                                            unfenced=u)
                             for s, r, v, e, t, h, c, u in rows]

                    def planned(batch, rid=rid):
                        replies.write(frame((rid, "planned", None, _planned(batch))))
                        replies.flush()

                    plan = commit_batch(conn, statements, batch, cached, planned)
                    commits_since_checkpoint += 1
                    if files.frames >= BACKSTOP_FRAMES:
                        commits_since_checkpoint = 0
                        try:
                            checkpoint(conn)
                        except sqlite3.Error:
                            pass  # (committed all the same: the next commit tries again)
                    if plan is cached:
                        result = None  # committed as the parent planned it
                    else:
                        plan.events = []  # (the parent needs the outcomes and heads only)
                        result = plan
                elif op == "checkpoint":
                    checkpoint(conn)
                    commits_since_checkpoint = 0
                    result = None
                elif op == "trace":  # (tests) True: record statements; False: hand them over
                    result, traced = traced, [] if args else None
                    conn.set_trace_callback(None if traced is None else traced.append)
                else:
                    raise ValueError(f"unknown request {op!r}")
            reply = (rid, "ok", result, _planned(batch))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the store
            if isinstance(exc, FilesChanged):
                files_changed = exc
            # Whatever failed, the next try opens a new connection: one reopened while the
            # file was unwritable stays read-only for good (tests/faults/test_db_outage.py).
            if conn is not None:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
                conn = None
            reply = (rid, "error", _error_payload(exc), _planned(batch))
        replies.write(frame(reply))
        replies.flush()


def main() -> None:
    _die_with_parent(int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent closes us when it stops
    watch.close_when_unused = True  # (its commit connection is the only one here)
    _serve(sys.stdin.fileno(), os.fdopen(int(sys.argv[2]), "wb"))


if __name__ == "__main__":
    main()
