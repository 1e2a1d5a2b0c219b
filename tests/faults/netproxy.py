"""A TCP proxy in front of PostgreSQL that can partition the network without closing anything.

A database that goes away by crashing or restarting closes its sockets: the client learns at
once. A host behind a dead switch or a dropped route says nothing: bytes go out and nothing
comes back, and the client's statement waits as long as TCP lets it (minutes). This proxy
plays that host: `partition()` keeps every connection open and silently discards what either
side sends (`replies_only=True`: only what the server sends, so a commit lands and its answer
is lost); new connections are accepted and then hear nothing. `heal()` forwards again, on new
connections only: TCP cannot resume a stream after dropped bytes, so the connections that
lived through the partition are cut then, as a real client would find them broken.
"""

from __future__ import annotations

import asyncio
import contextlib


class PartitionProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.base_events.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task] = set()
        self.partitioned = False
        self.replies_only = False
        self.dropped_bytes = 0

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> "PartitionProxy":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._cut_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def partition(self, *, replies_only: bool = False) -> None:
        self.partitioned = True
        self.replies_only = replies_only

    def heal(self) -> None:
        self.partitioned = False
        self.replies_only = False
        self._cut_all()

    def _cut_all(self) -> None:
        for client, server in list(self._links):
            for writer in (client, server):
                if writer is not None:
                    with contextlib.suppress(Exception):
                        writer.transport.abort()
        self._links.clear()

    def _drops(self, upstream_bound: bool) -> bool:
        return self.partitioned and not (upstream_bound and self.replies_only)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter):
        if self.partitioned:
            # A new connection to an unreachable host: it never completes its handshake.
            self._links.add((client_w, None))
            await _drain_silently(client_r)
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_w.transport.abort()
            return
        link = (client_w, server_w)
        self._links.add(link)
        for src, dst, upstream_bound in ((client_r, server_w, True), (server_r, client_w, False)):
            task = asyncio.create_task(self._pump(src, dst, upstream_bound))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    upstream_bound: bool) -> None:
        with contextlib.suppress(Exception):
            while chunk := await src.read(65536):
                if self._drops(upstream_bound):
                    self.dropped_bytes += len(chunk)
                    continue
                dst.write(chunk)
                await dst.drain()
        with contextlib.suppress(Exception):
            dst.transport.abort()


async def _drain_silently(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(Exception):
        while await reader.read(65536):
            pass
