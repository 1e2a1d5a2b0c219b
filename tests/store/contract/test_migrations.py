"""Alembic owns the schema: upgrade/downgrade work on both dialects, the migrated database
matches session_store.storage.schema exactly, and the store refuses a schema it does not know."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from session_store import events as ev
from session_store.storage import schema as schema_module
from session_store import open_store
from session_store.errors import CannotOpen, SchemaMismatch, StoreUnavailable
from session_store.storage.migrate import alembic_config, downgrade, upgrade
from session_store.storage.schema import HEAD_REVISION, KNOWN_REVISIONS, metadata
from session_store.storage import store as storage_base
from session_store.audit.verify import verify_log

from ..helpers import insert_raw_event, raw_db, sql

TABLES = {"session_streams", "session_events", "session_snapshots"}


async def _tables(backend) -> set[str]:
    async with raw_db(backend) as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


async def _upgrade(backend, revision="head"):
    await upgrade(backend.url, revision, schema=backend.options.get("schema"))


async def _downgrade(backend, revision="base"):
    await downgrade(backend.url, revision, schema=backend.options.get("schema"))


def test_known_revisions_match_the_migration_scripts():
    script = ScriptDirectory.from_config(alembic_config("sqlite+aiosqlite:///unused.db"))
    history = [rev.revision for rev in reversed(list(script.walk_revisions()))]
    assert tuple(history) == KNOWN_REVISIONS, "update schema.KNOWN_REVISIONS"
    assert script.get_heads() == [HEAD_REVISION]


@pytest.mark.timeout(60)
async def test_upgrade_downgrade_upgrade(backend):
    assert await _tables(backend) == set()
    await _upgrade(backend)
    assert TABLES | {"alembic_version"} <= await _tables(backend)
    assert await sql(backend, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]
    store = await backend.open()
    await store.append("s", [ev.SessionClosed()], 0)
    await store.close()

    await _downgrade(backend)
    assert not (TABLES & await _tables(backend))
    assert await sql(backend, "SELECT version_num FROM alembic_version") == []

    await _upgrade(backend)
    assert TABLES <= await _tables(backend)
    store = await backend.open()
    try:
        assert await store.read_all() == []  # a new, empty log
        assert await store.append("s", [ev.SessionClosed()], 0) == 1
    finally:
        await store.close()
    await _upgrade(backend)  # already at head: a no-op
    assert await sql(backend, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]


async def _indexes(backend) -> set[str]:
    async with raw_db(backend) as conn:
        return {ix["name"] for ix in await conn.run_sync(
            lambda c: inspect(c).get_indexes("session_events"))}


@pytest.mark.timeout(60)
async def test_a_log_written_at_0001_keeps_its_order_and_chain_through_0002(backend):
    """0002 drops SQLite's (tx_order, position) index (its order is the primary key's) and
    keeps PostgreSQL's: a log written at 0001 reads the same, in the same global order, with
    an intact hash chain, after the upgrade and after a downgrade to 0001 again."""
    await _upgrade(backend, "0001_initial")
    for n in range(6):  # two streams, interleaved: the global order is not each stream's
        await insert_raw_event(backend, f"s{n % 2}", "conversation.message", 1,
                               '{"generation":1,"role":"user","text":"t%d"}' % n)
    assert "ix_session_events_tx_order_position" in await _indexes(backend)

    async def read_back():
        store = await backend.open()
        try:
            log = [(e.stream_id, e.version, e.position) for e in await store.read_all()]
            page = [e.position for e in await store.read_all(log[1][2], limit=3)]
            reports = await verify_log(store)
        finally:
            await store.close()
        assert [r.ok for r in reports] == [True, True], reports
        assert page == [p for _, _, p in log[2:5]]
        return log

    await _upgrade(backend)
    kept = "ix_session_events_tx_order_position" in await _indexes(backend)
    assert kept == (backend.name == "postgres")
    before = await read_back()
    assert [(s, v) for s, v, _ in before] == [(f"s{n % 2}", n // 2 + 1) for n in range(6)]
    await _downgrade(backend, "0001_initial")
    assert "ix_session_events_tx_order_position" in await _indexes(backend)
    await _upgrade(backend)
    assert await read_back() == before


@pytest.mark.timeout(60)
async def test_migrated_database_matches_the_metadata(migrated):
    def diff(sync_conn):
        ctx = MigrationContext.configure(sync_conn, opts={
            "compare_type": True, "compare_server_default": True,
            "include_object": schema_module.on_dialect(sync_conn.dialect.name)})
        return compare_metadata(ctx, metadata)

    async with raw_db(migrated) as conn:
        changes = await conn.run_sync(diff)
    assert changes == [], f"the migrations and session_store.storage.schema disagree: {changes}"


async def test_unmigrated_database_is_refused_with_what_to_run(backend):
    with pytest.raises(SchemaMismatch) as err:
        await backend.open()
    assert "session-store migrate" in str(err.value)


async def test_database_downgraded_to_base_is_refused_with_what_to_run(migrated):
    await _downgrade(migrated)
    with pytest.raises(SchemaMismatch) as err:
        await migrated.open()
    assert "session-store migrate" in str(err.value)
    assert "newer" not in str(err.value)


async def test_database_migrated_by_newer_code_is_refused(migrated):
    await sql(migrated, "UPDATE alembic_version SET version_num = '0099_from_the_future'")
    with pytest.raises(SchemaMismatch) as err:
        await migrated.open()
    message = str(err.value)
    assert "0099_from_the_future" in message and "newer code" in message
    assert "upgrade this code" in message


async def test_database_older_than_the_code_is_refused(migrated, monkeypatch):
    """Simulate the next release (one more revision) running on today's schema."""
    monkeypatch.setattr(schema_module, "KNOWN_REVISIONS", KNOWN_REVISIONS + ("0002_next",))
    monkeypatch.setattr(schema_module, "HEAD_REVISION", "0002_next")
    monkeypatch.setattr(storage_base, "HEAD_REVISION", "0002_next")
    with pytest.raises(SchemaMismatch) as err:
        await migrated.open()
    message = str(err.value)
    assert f"revision {HEAD_REVISION}, older than" in message
    assert "session-store migrate" in message


async def test_store_opens_on_head(migrated):
    store = await migrated.open()
    await store.close()


async def test_a_database_that_refuses_to_be_used_says_so_and_is_no_outage(backend, tmp_path):
    """No such database (PostgreSQL), a file that is not SQLite: CannotOpen, naming what
    the database said, not the driver's exception (the CLI printed a traceback) nor
    StoreUnavailable (waiting would not fix it)."""
    if backend.name == "postgres":
        url = make_url(backend.url).set(database="no_such_database_here").render_as_string(
            hide_password=False)
        expected = 'database "no_such_database_here" does not exist'
    else:
        path = tmp_path / "notes.txt"
        path.write_text("these are my notes, not a database\n" * 200)
        url = f"sqlite+aiosqlite:///{path}"
        expected = "file is not a database"
    with pytest.raises(CannotOpen) as err:
        await open_store(url, **backend.options)
    assert expected in str(err.value) and "check the URL" in str(err.value)
    assert not isinstance(err.value, StoreUnavailable)
