"""PostgreSQL's writer connections: replaced when the server kills them, a head row locked
past `lock_timeout` or a read-only server waited out as an outage, not raised.

(The head cache these writers plan from is the contract's:
tests/store/contract/test_head_cache.py.)
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from session_store.errors import StoreUnavailable

from ...conftest import PG_DSN
from ..contract.test_head_cache import _texts
from ..helpers import msg


async def locked_append_fails_at_its_deadline(store, raw, schema):
    async with raw.transaction():
        await raw.execute(f"SELECT 1 FROM {schema}.session_streams WHERE stream_id = 's' "
                          "FOR UPDATE")
        try:
            await store.append("s", [msg(2)], 2, timeout=1.0)
        except Exception as exc:  # noqa: BLE001 - returned to the test
            return exc
    return None


@pytest.mark.timeout(60)
async def test_writer_connections_killed_by_the_server_are_replaced(migrated):
    """PostgreSQL: the one-round-trip path needs a function in each writer connection's
    temporary schema; a replacement connection gets its own."""
    store = await migrated.open()
    raw = await asyncpg.connect(PG_DSN)
    try:
        await store.append("s", [msg(0)], 0)
        await store.append("s", [msg(1)], 1)
        pids = [c.get_server_pid() for c in store._committer._free]
        assert pids
        for pid in pids:
            assert await raw.fetchval("SELECT pg_terminate_backend($1)", pid)
        # Whether the client saw the end before the next statement (then it skips the dead
        # connection) or only on it (then the batch is retried on a new one) is a race.
        assert await store.append("s", [msg(2)], 2) == 3
        cached = store.stats["cached_plans"]
        assert await store.append("s", [msg(3)], 3) == 4
        assert store.stats["cached_plans"] > cached  # one round trip again, new connection
        assert not {c.get_server_pid() for c in store._committer._free} & set(pids)
        assert await _texts(store, "s") == [f"turn {i}" for i in range(4)]
    finally:
        await raw.close()
        await store.close()


@pytest.mark.timeout(60)
async def test_a_head_row_locked_past_lock_timeout_is_waited_out_not_raised(migrated):
    """PostgreSQL writers give up on a row lock after `lock_timeout` (so a frozen writer
    cannot stall every batch behind it). Giving up raised asyncpg's LockNotAvailableError
    to the caller at once (no StoreUnavailable, no retry within the append's deadline); it
    is the database not taking the append for now, as an outage is."""
    store = await migrated.open(attempt_timeout=None)
    store._committer._writer_kwargs["server_settings"]["lock_timeout"] = "300ms"  # (15 s by default)
    await store.append("s", [msg(0)], 0)
    schema = migrated.options["schema"]
    raw = await asyncpg.connect(PG_DSN)
    try:
        locked = raw.transaction()
        await locked.start()
        await raw.execute(f"SELECT 1 FROM {schema}.session_streams WHERE stream_id = 's' "
                          "FOR UPDATE")
        append = asyncio.ensure_future(store.append("s", [msg(1)], 1, timeout=20))
        await asyncio.sleep(1.5)  # several lock timeouts
        assert not append.done(), append.exception() if append.done() else None
        await locked.rollback()
        assert await asyncio.wait_for(append, 10) == 2
        with_deadline = await locked_append_fails_at_its_deadline(store, raw, schema)
        assert isinstance(with_deadline, StoreUnavailable), repr(with_deadline)
        assert await _texts(store, "s") == ["turn 0", "turn 1"]
    finally:
        await raw.close()
        await store.close()


@pytest.mark.timeout(60)
async def test_a_read_only_server_is_an_outage_waited_out_not_raised(migrated):
    """A standby during a failover (or a database set read-only for maintenance) answers
    every write with "cannot execute ... in a read-only transaction". That is the database
    not taking appends for now (SQLite's SQLITE_READONLY is one already): it failed the
    append at once with asyncpg's ReadOnlySQLTransactionError. Here the writer connections
    are read-only sessions until the "failover" ends."""
    store = await migrated.open()
    await store.append("s", [msg(0)], 0)
    for conn in store._committer._free:  # connections from now on: read-only, as on a standby
        conn.terminate()
    settings = store._committer._writer_kwargs["server_settings"]
    settings["default_transaction_read_only"] = "on"
    try:
        append = asyncio.ensure_future(store.append("s", [msg(1)], 1, timeout=20))
        await asyncio.sleep(1.0)
        assert not append.done(), append.exception() if append.done() else None
        del settings["default_transaction_read_only"]  # promoted: writes go through again
        assert await asyncio.wait_for(append, 10) == 2
        assert await _texts(store, "s") == ["turn 0", "turn 1"]
    finally:
        await store.close()
