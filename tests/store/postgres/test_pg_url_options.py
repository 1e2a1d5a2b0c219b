"""PostgreSQL: the connection options a database URL carries reach every connection.

The store connects three ways: SQLAlchemy's pool (reads, snapshots), its writers' own
asyncpg connections (appends) and a follower's LISTEN connection. A URL's query options
(`?ssl=require`, `?host=/run/postgresql`, `?target_session_attrs=read-write`) are what a
deployment uses to say how to reach its server: the writers and the listener must use them
too, or appends go where the reads do not (or in clear text where TLS was asked for).
An option asyncpg does not take (libpq's `sslmode`) is refused when the URL is checked, in
one line, not a driver traceback at the first connect.
"""

from __future__ import annotations

import os
import uuid

import asyncpg
import pytest

from session_store import open_store
from session_store.events import ConversationMessage
from session_store.storage.migrate import upgrade
from session_store.storage import check_url

from ...conftest import PG_DSN, PG_URL

SOCKET_DIR = "/var/run/postgresql"


@pytest.fixture
async def pg_schema():
    schema = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
        await upgrade(PG_URL, schema=schema)
        yield schema
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


async def test_writers_and_listeners_connect_where_the_url_says(pg_schema, monkeypatch, tmp_path):
    """The URL names the server by its socket directory (`?host=`), and the environment's
    default host leads nowhere: every connection must take the URL's host."""
    if not os.path.exists(f"{SOCKET_DIR}/.s.PGSQL.5432"):
        pytest.skip(f"no PostgreSQL socket in {SOCKET_DIR}")
    monkeypatch.setenv("PGHOST", str(tmp_path / "no-server-here"))
    url = f"postgresql+asyncpg://postgres@/test?host={SOCKET_DIR}"
    store = await open_store(url, schema=pg_schema, append_timeout=3.0)
    try:
        assert await store.append("s1", [ConversationMessage("user", "hi", 1)], 0) == 1
        async with store._change_notifications() as notifications:
            assert await notifications.listening(), "the follower could not LISTEN"
        assert [e.stream_id for e in await store.read_all()] == ["s1"]
    finally:
        await store.close()


@pytest.mark.parametrize("option", ["sslmode=require", "no_such_option=1"])
def test_an_option_asyncpg_does_not_take_is_refused_in_one_line(option):
    with pytest.raises(ValueError) as info:
        check_url(f"postgresql+asyncpg://u:pw-in-url@127.0.0.1/db?{option}")
    message = str(info.value)
    assert option.split("=")[0] in message and "pw-in-url" not in message
    if option.startswith("sslmode"):
        assert "ssl=require" in message  # what to write instead


def test_options_asyncpg_and_sqlalchemy_take_pass_the_check():
    for query in ("ssl=require", "host=/run/postgresql", "target_session_attrs=read-write",
                  "prepared_statement_cache_size=0", "command_timeout=10"):
        assert check_url(f"postgresql+asyncpg://u@h/db?{query}") == "postgresql+asyncpg"
