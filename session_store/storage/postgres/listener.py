"""A follower's LISTEN connection on PostgreSQL, kept up across outages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from ..group_commit import describe_outage

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 1.0


class Listener:
    """LISTEN on the store's channel for one follower, kept up across outages.

    The connection dies with the server (a restart, a failover) or the network; nothing
    tells a follower waiting for a notification, which then only polls (a restart of a few
    seconds between two polls left followers on `poll_interval` for good). Losing it wakes
    the follower, and each `listening()` makes a new one if it is gone; a failure to
    connect is not the follower's error (its reads say whether the database is there):
    it polls, and tries again at its next wake-up."""

    def __init__(self, connect_kwargs: dict, channel: str, on_change: Callable[[], None]):
        self._connect_kwargs = connect_kwargs  # asyncpg.connect's, as the pool's
        self._channel = channel
        self._on_change = on_change  # wakes the follower
        self._conn: asyncpg.Connection | None = None
        self._warned = False  # (once per outage)
        self._missed = False  # a connection was lost: notifications may have been missed

    async def listening(self) -> bool:
        if self._conn is not None and not self._conn.is_closed():
            return True
        self._drop()
        try:
            conn = await asyncpg.connect(**self._connect_kwargs)
            try:
                # Bounded as the connect is: a network gone silent in between left the
                # follower in this LISTEN, neither reading nor raising, for the partition.
                # (asyncio.timeout: 3.11's wait_for loses a cancel that meets the answer.)
                async with asyncio.timeout(self._connect_kwargs["timeout"]):
                    await conn.add_listener(self._channel, self._on_notify)
            except BaseException:
                conn.terminate()
                raise
        except Exception as exc:  # noqa: BLE001 - the follower polls meanwhile
            if not self._warned:
                log.warning("cannot LISTEN for new events (%s): polling until it can",
                            describe_outage(exc))
            self._warned = self._missed = True
            return False
        conn.add_termination_listener(self._on_lost)
        self._conn, self._warned = conn, False
        if self._missed:
            self._missed = False
            self._on_change()  # what committed meanwhile was not notified: read again
        return True

    def _on_notify(self, *_args) -> None:
        self._on_change()

    def _on_lost(self, _conn) -> None:
        self._missed = True
        self._on_change()  # wake the follower: it connects again

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await close_quickly(conn)


async def close_quickly(conn: asyncpg.Connection) -> None:
    """Close politely if the server answers soon; a server behind a dead network never
    does (asyncpg waits for its end of the socket): then just drop the connection."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await conn.close()
    if not conn.is_closed():
        conn.terminate()
