"""The SQLite store's writer: its handle on the child process that runs the group commits
(child.py).

Why a process and not a thread: a thread's sqlite3 call must take the GIL back from the
event loop after every step (and after the fsync), and a live call keeps the loop busy. With
the loop doing Python work in 0.3 ms slices, a commit on a thread took 1.6 ms at the median
and 5.9 s at p99, in the process 3.0 and 7.5 ms; with two such tasks 11 ms and 9.8 s against
5.2 and 6.1 ms (bench/busy_loop_commit.py). The process has its own interpreter; the loop
hears back through a pipe, as it hears from PostgreSQL through a socket.

Protocol and checkpoints: child.py.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sqlite3
import sys
from pathlib import Path
from typing import Any

from ..batch import BatchPlan, _AppendRequest
from .child import HEADER, frame
from .commit import FilesChanged, Statements


def _request_rows(batch: list[_AppendRequest]) -> list[tuple]:
    return [(r.stream_id, r.rows, r.expected_version, r.epoch, r.recorded_at_us, r.final_hash,
             r.claim, r.unfenced) for r in batch]


def _error_from(payload: tuple) -> BaseException:
    kind, name, message, code, code_name = payload
    if kind == "files":
        return FilesChanged(message)
    if kind == "sqlite3":
        cls = getattr(sqlite3, name, sqlite3.Error)
        if not (isinstance(cls, type) and issubclass(cls, sqlite3.Error)):
            cls = sqlite3.Error
        exc = cls(message)
        if code is not None:
            exc.sqlite_errorcode, exc.sqlite_errorname = code, code_name
        return exc
    return RuntimeError(f"the SQLite writer process failed: {name}: {message}")


def _gone(detail: str) -> sqlite3.OperationalError:
    """The writer process is gone: an outage (the store retries with a new one until the
    append's deadline), not a bug. Its last commit may or may not have happened."""
    exc = sqlite3.OperationalError(f"the SQLite writer process {detail}")
    exc.sqlite_errorcode, exc.sqlite_errorname = sqlite3.SQLITE_IOERR, "SQLITE_IOERR"
    return exc


# ---------------------------------------------------------------------- the parent's side
class _Replies(asyncio.Protocol):
    """The answers pipe: frames are cut and dispatched as they arrive, in the loop's own
    callback. (A reader task in between cost each commit one more turn of the event loop,
    behind whatever else it runs: in a live call, a turn's audio.)"""

    def __init__(self, child: _Child):
        self.child = child
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= HEADER.size:
            size = HEADER.unpack_from(self.buffer)[0]
            if len(self.buffer) < HEADER.size + size:
                return
            body = bytes(self.buffer[HEADER.size:HEADER.size + size])
            del self.buffer[:HEADER.size + size]
            try:
                reply = pickle.loads(body)
            except Exception as exc:  # noqa: BLE001 - a reply we cannot read: treat it as gone
                error = _gone(f"sent a reply that cannot be read ({exc!r})")
                error.__cause__ = exc
                self.child.fail(error)
                return
            self.child.answer(*reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.child.lost(exc)


class _Child:
    """One writer process and what is in flight with it: a new process gets a new one, so a
    dead child's answers can only settle (or fail) its own requests."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.transport: asyncio.BaseTransport | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.batches: dict[int, list[_AppendRequest] | None] = {}  # the requests of each
        self.failed = False  # its answers can no longer be read: no new request goes to it
        self.done = asyncio.get_running_loop().create_future()  # its pending are all settled

    def alive(self) -> bool:
        return self.proc.returncode is None and not self.failed

    def answer(self, rid: int, status: str, result: Any, planned: list) -> None:
        # The plan's hashes (and versions), on the requests themselves: they must be there
        # even if the answer never comes (or its caller has gone).
        for request, (final_hash, version) in zip(self.batches.get(rid) or (), planned):
            request.final_hash, request.expected_version = final_hash, version
        if status == "planned":
            return
        self.batches.pop(rid, None)
        reply = self.pending.pop(rid, None)
        if reply is not None and not reply.done():
            reply.set_result((status, result))

    def abandon(self) -> None:
        """Its answer is no longer awaited (an attempt was cut: a disk that stopped answering,
        a stopped process): kill it, so it cannot commit later. What it sent before dying is
        still read until its pipe closes: a batch it planned has its hashes on the requests
        before the next child is started (`_spawn` waits for that), so a retry recognises a
        commit that did happen."""
        self.failed = True  # no new request goes to it
        if self.proc.returncode is None:
            self.proc.kill()

    def fail(self, error: BaseException) -> None:
        """Nothing more can be read from it: every request in flight fails as an outage."""
        self.failed = True
        if self.proc.returncode is None:
            self.proc.kill()
        if self.transport is not None:
            self.transport.close()
        self._settle(error)

    def lost(self, exc: Exception | None) -> None:
        """The answers pipe closed: the child exited (or was killed by `fail`)."""
        self.failed = True
        asyncio.ensure_future(self._after_exit(exc))

    async def _after_exit(self, exc: Exception | None) -> None:
        error = _gone(f"exited (code {await self.proc.wait()})")
        error.__cause__ = exc
        self._settle(error)

    def _settle(self, error: BaseException) -> None:
        for reply in self.pending.values():
            if not reply.done():
                reply.set_exception(error)
        self.pending.clear()
        if not self.done.done():
            self.done.set_result(None)

    async def stop(self) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None:
            self.proc.stdin.close()  # the child ends after the request it is on
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.transport is not None:
            await self.done


class WriterProcess:
    """The store's handle on its writer process: started on open, started again after it
    died (the request that saw it die fails as an outage and is retried)."""

    #: The module the child runs (`main()`); a test runs one that dies at a chosen moment.
    child_module = "session_store.storage.sqlite.child"

    def __init__(self, path: str, statements: Statements):
        self._path, self._statements = path, statements
        self._child: _Child | None = None
        self._next_id = 0
        self._lock = asyncio.Lock()  # one request written at a time (frames never interleave)

    async def start(self) -> None:
        """Start the process and open its connection (an error here fails the store's open)."""
        async with self._lock:
            opened = await self._spawn()
        status, result = await opened
        if status != "ok":
            raise _error_from(result)

    async def commit(self, batch: list[_AppendRequest], cached: BatchPlan | None) -> BatchPlan:
        """Commit a batch there (`commit_batch`); sets each request's `final_hash`. The rows
        are taken once a live child is there: after an abandoned one, only then are the
        hashes it planned known (see `_Child.abandon`)."""
        plan = await self._call("commit", lambda: (_request_rows(batch), cached), batch)
        if plan is None:  # committed as cached: the child replies None only for a plan
            assert cached is not None
            return cached
        return plan

    def abandon(self) -> None:
        """The request in flight is no longer awaited: the child must not commit it later."""
        if self._child is not None:
            self._child.abandon()

    async def checkpoint(self) -> None:
        await self._call("checkpoint", None)

    async def trace(self, on: bool) -> list[str] | None:
        """(Tests.) Start recording the statements the writer runs, or stop and return them."""
        return await self._call("trace", on)

    async def _spawn(self) -> asyncio.Future:
        """(Under the lock.) A new process; returns the future of its "open" reply."""
        old, self._child = self._child, None
        if old is not None:
            await old.stop()
        package_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH"))
                                            if p)
        loop = asyncio.get_running_loop()
        # Replies come on a pipe of their own: whatever the child prints (a sitecustomize, a
        # warning) goes to the stdout and stderr it inherits, never into the protocol.
        read_fd, write_fd = os.pipe()
        try:
            # -P: the working directory is not put first on the path (it could hold another
            # `session_store`); this package's root is, by PYTHONPATH.
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-m", self.child_module, str(os.getpid()), str(write_fd),
                env=env, stdin=asyncio.subprocess.PIPE, pass_fds=(write_fd,))
        except BaseException as exc:
            os.close(read_fd)  # (also when a cut attempt cancels the start)
            if isinstance(exc, OSError):  # out of processes, memory or descriptors: an outage
                raise _gone(f"cannot be started ({exc})") from exc
            raise
        finally:
            os.close(write_fd)
        child = _Child(proc)
        try:
            child.transport, _ = await loop.connect_read_pipe(
                lambda: _Replies(child), os.fdopen(read_fd, "rb", 0))
        except BaseException:
            proc.kill()
            await proc.wait()
            raise
        self._child = child
        return await self._send(child, "open", (self._path, self._statements))

    async def _send(self, child: _Child, op: str, args: Any,
                    batch: list[_AppendRequest] | None = None) -> asyncio.Future:
        """(Under the lock.) Write one request; returns the future of its reply."""
        rid, self._next_id = self._next_id, self._next_id + 1
        reply = asyncio.get_running_loop().create_future()
        child.pending[rid] = reply
        child.batches[rid] = batch
        stdin = child.proc.stdin
        assert stdin is not None  # (spawned with a pipe)
        try:
            stdin.write(frame((rid, op, args)))
            await stdin.drain()
        except (ConnectionError, RuntimeError) as exc:  # the pipe broke: it is gone
            child.pending.pop(rid, None)
            raise _gone(f"cannot be reached ({exc})") from exc
        except asyncio.CancelledError:
            child.pending.pop(rid, None)  # (the child may still answer: nobody listens)
            raise
        return reply

    async def _call(self, op: str, args: Any, batch: list[_AppendRequest] | None = None):
        async with self._lock:
            if self._child is None or not self._child.alive():
                # A new process after one died: its "open" reply is not awaited (a failure
                # to open comes back as this request's own error, the child opens again).
                opened = await self._spawn()
                opened.add_done_callback(lambda f: f.cancelled() or f.exception())
            assert self._child is not None  # (_spawn sets it)
            reply = await self._send(self._child, op, args() if callable(args) else args,
                                     batch)
        status, result = await reply
        if status != "ok":
            raise _error_from(result)
        return result

    async def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            await child.stop()


