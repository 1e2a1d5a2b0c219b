"""Each database the tools cannot use gets the right one-line diagnosis, exit code 2
(issue #27, item 5): a directory as the SQLite file, a schema without a recorded revision
(and `migrate` refusing to create tables over it), a PostgreSQL role that may not read, a
database that persists nothing; read-only SQLite files and directories are read, and no
command but `migrate` starts SQLite's writer process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from session_store import CannotOpen, open_store
from session_store.commands.cli import app
from session_store.storage.schema import HEAD_REVISION
from session_store.storage.sqlite.writer import WriterProcess
from tests.conftest import PG_DSN
from tests.faults.sqlitefaults import CannotFault, _chattr, check_immutable_works

from .conftest import sql
from .helpers import failing_call, one_line_error, support_call, write_call

_runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
ALEMBIC = Path(sys.executable).parent / "alembic"


def _invoke(*args: str):
    return _runner.invoke(app, list(args))  # exceptions caught: a traceback is a result here


async def _cli(*args: str):
    return await asyncio.to_thread(_invoke, *args)


# --------------------------------------------------------------------------- SQLite paths

def test_a_directory_is_not_a_sqlite_database(tmp_path):
    """It was "cannot reach the database" (as if it were down)."""
    for form in (str(tmp_path), f"sqlite+aiosqlite:///{tmp_path}"):
        for command in (["calls"], ["verify"], ["migrate"]):
            one_line_error(_invoke(*command, "--db", form),
                            f"{tmp_path} is a directory, not a SQLite database file")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite+aiosqlite:///:memory:", "sqlite+aiosqlite:///",
                                 "sqlite:///:memory:", ":memory:",
                                 "sqlite+aiosqlite:///file:x?mode=memory&uri=true"])
def test_migrate_refuses_a_database_that_persists_nothing(url):
    """It said "schema is at head" and persisted nothing."""
    one_line_error(_invoke("migrate", "--db", url), "needs a database file",
                    "nothing would persist")


# --------------------------------------------------------------------------- no revision

async def _unrecorded(backend, how: str) -> None:
    if how == "emptied":
        await sql(backend, "DELETE FROM alembic_version")
    else:
        await sql(backend, "DROP TABLE alembic_version")


@pytest.mark.parametrize("how", ["emptied", "dropped"])
async def test_tables_without_a_revision_are_said_so_and_migrate_does_not_build_over_them(
        migrated, how):
    """An emptied alembic_version said "run migrate", and migrate then failed with "table
    session_streams already exists". Now both say what is wrong; the stamp they advise
    works, and the calls are all there."""
    await write_call(migrated, "support-1", support_call())
    await _unrecorded(migrated, how)
    one_line_error(await _cli("calls", *migrated.cli_args),
                    "has session store tables but no recorded schema revision",
                    unsaid=("(alembic upgrade head) first",))
    one_line_error(await _cli("migrate", *migrated.cli_args),
                    "has session store tables but no recorded schema revision",
                    f"they are this code's schema (revision {HEAD_REVISION})", "stamp",
                    unsaid=("already exists",))
    # The advice, as given.
    x = ["-x", f"url={migrated.url}"] + (["-x", f"schema={migrated.options['schema']}"]
                                         if "schema" in migrated.options else [])
    stamped = await asyncio.to_thread(
        subprocess.run, [str(ALEMBIC), "-c", "alembic.ini", *x, "stamp", HEAD_REVISION],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert stamped.returncode == 0, stamped.stderr
    assert (await _cli("migrate", *migrated.cli_args)).exit_code == 0
    listed = await _cli("calls", "--json", *migrated.cli_args)
    assert [c["call"] for c in json.loads(listed.stdout)["calls"]] == ["support-1"]


async def test_tables_without_a_revision_that_are_not_this_codes_are_said_so(migrated):
    await sql(migrated, "ALTER TABLE session_streams ADD COLUMN note TEXT")
    await _unrecorded(migrated, "emptied")
    one_line_error(await _cli("migrate", *migrated.cli_args),
                    "no recorded schema revision", "not this code's schema either",
                    unsaid=("already exists", "stamp 0"))


# --------------------------------------------------------------------------- PostgreSQL roles

@pytest.fixture
async def role(migrated):
    """A login role of its own (dropped after), and a way to grant it things."""
    if migrated.name != "postgres":
        pytest.skip("PostgreSQL roles")
    name = f"r_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(PG_DSN)
    await admin.execute(f"CREATE ROLE {name} LOGIN")
    url = make_url(migrated.url).set(username=name).render_as_string(hide_password=False)
    schema = migrated.options["schema"]

    async def grant(what: str) -> None:
        await admin.execute(f"GRANT {what} TO {name}".replace("SCHEMA", f"SCHEMA {schema}"))

    try:
        yield url, schema, grant
    finally:
        await admin.execute(f"DROP OWNED BY {name}")
        await admin.execute(f"DROP ROLE {name}")
        await admin.close()


async def test_a_role_that_may_not_read_is_told_so_not_to_run_migrate(migrated, role):
    url, schema, grant = role
    await write_call(migrated, "failing-1", failing_call())
    one_line_error(await _cli("calls", "--db", url, "--schema", schema),
                    f"may not use the schema {schema}", unsaid=("migrate --db",))
    await grant("USAGE ON SCHEMA")
    one_line_error(await _cli("calls", "--db", url, "--schema", schema),
                    "may not use the session store's tables", "permission denied",
                    unsaid=("migrate --db",))
    await grant("SELECT ON alembic_version IN SCHEMA".replace(
        "alembic_version IN SCHEMA", f"{schema}.alembic_version, {schema}.session_streams"))
    one_line_error(await _cli("verify", "--db", url, "--schema", schema),
                    "may not use the session store's tables", "permission denied")
    await grant("SELECT ON ALL TABLES IN SCHEMA")
    listed = await _cli("calls", "--json", "--db", url, "--schema", schema)
    assert [c["call"] for c in json.loads(listed.stdout)["calls"]] == ["failing-1"]
    # Reading is all it may do: a store that appends is refused at open, not at its first
    # append (a raw asyncpg error, inside a call).
    with pytest.raises(CannotOpen, match="may read the session store but not append to it"):
        await open_store(url, schema=schema)


async def test_a_schema_that_does_not_exist_is_said_so(migrated):
    if migrated.name != "postgres":
        pytest.skip("PostgreSQL schemas")
    missing = f"nothere_{uuid.uuid4().hex[:8]}"
    one_line_error(await _cli("calls", "--db", migrated.url, "--schema", missing),
                   f"the schema {missing} does not exist in this database")


# --------------------------------------------------------------------------- read-only SQLite

@pytest.fixture
def immutable(tmp_path):
    """`chattr +i` on what the test names; lifted after."""
    try:
        check_immutable_works(tmp_path)
    except CannotFault as exc:
        pytest.skip(str(exc))
    made: list[Path] = []

    def make(*paths: Path) -> None:
        _chattr("+i", list(paths))
        made.extend(paths)

    try:
        yield make
    finally:
        if made:
            _chattr("-i", made)


@pytest.fixture
def writer_starts(monkeypatch) -> list[str]:
    """Every start of a SQLite writer process in this test (it still starts)."""
    started: list[str] = []
    real_start = WriterProcess.start

    async def start(self):
        started.append(self._path)
        return await real_start(self)

    monkeypatch.setattr(WriterProcess, "start", start)
    return started


async def _a_written_sqlite_log(tmp_path) -> tuple[Path, str]:
    """A migrated log in tmp_path/db/ with a call, in WAL mode, closed cleanly (no -wal,
    no -shm left)."""
    directory = tmp_path / "db"
    directory.mkdir()
    path = directory / "log.db"
    url = f"sqlite+aiosqlite:///{path}"
    from tests.conftest import Backend

    backend = Backend("sqlite", url)
    await backend.migrate()
    await write_call(backend, "support-1", support_call())
    store = await open_store(url)  # (the writer sets WAL mode)
    await store.close()
    assert sorted(p.name for p in directory.iterdir()) == ["log.db"]
    return path, url


@pytest.mark.parametrize("what", ["file", "directory"])
async def test_read_only_sqlite_is_read_by_every_tool_and_refused_by_a_store_that_appends(
        tmp_path, immutable, writer_starts, what):
    """`calls` and `verify` gave a traceback, exit 1 (open_store raised the writer's raw
    sqlite3.OperationalError), or "cannot reach the database"; every read-only command
    started the writer process."""
    path, url = await _a_written_sqlite_log(tmp_path)
    writer_starts.clear()
    immutable(path if what == "file" else path.parent)
    listed = await _cli("calls", "--json", "--db", url)
    assert listed.exit_code == 0, listed.output
    assert [c["call"] for c in json.loads(listed.stdout)["calls"]] == ["support-1"]
    verified = await _cli("verify", "--db", str(path))
    assert verified.exit_code == 0 and "ok   support-1: 25 events" in verified.stdout, \
        verified.output
    for command in (["timeline", "support-1"], ["state", "support-1"],
                    ["export", "support-1"], ["replay", "support-1"]):
        r = await _cli(*command, "--db", url)
        assert r.exit_code == 0, (command, r.output)
    assert writer_starts == [], "a read-only command started the SQLite writer process"
    with pytest.raises(CannotOpen, match="cannot be written .* read-only"):
        await open_store(url)
    assert writer_starts == []  # (refused before it)
    migrate = await _cli("migrate", "--db", url)
    one_line_error(migrate, "cannot be written")


async def test_only_migrate_starts_the_writer_process(tmp_path, writer_starts):
    """The control for the test above: the spy sees a store that appends start one."""
    path, url = await _a_written_sqlite_log(tmp_path)
    assert writer_starts == [str(path)]
