"""`--db` is strict (issue #25, item 8): a SQLite file's path or a URL in the forms other tools
print, mapped to the store's async drivers; a SQLite file that does not exist is said to be
missing (it was "run migrate", which would have made an empty database there); `--version`."""

from __future__ import annotations

import asyncio
import json
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from session_store.commands.cli import app
from session_store.storage.migrate import upgrade
from tests.conftest import Backend

from .helpers import failing_call, one_line_error, write_call

_runner = CliRunner()


def _invoke(*args: str, **env: str):
    return _runner.invoke(app, list(args), env=env or None)  # a traceback is a result here


def _calls(result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [c["call"] for c in json.loads(result.stdout)["calls"]]


def test_version_is_the_installed_package_version():
    r = _invoke("--version")
    assert r.exit_code == 0, r.output
    assert r.stdout == f"session-store {version('durable-gemini-sessions')}\n"
    import session_store  # the library says the same version as the command

    assert session_store.__version__ == version("durable-gemini-sessions")


async def test_a_sqlite_database_is_a_path_or_a_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = await asyncio.to_thread(_invoke, "migrate", "--db", "calls.db")
    assert made.exit_code == 0 and made.stdout == f"schema is at head in {tmp_path}/calls.db\n"
    await write_call(Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path}/calls.db"), "c-1",
                     failing_call())
    for form in ("calls.db", "./calls.db", str(tmp_path / "calls.db"),
                 f"sqlite:///{tmp_path}/calls.db", f"sqlite+aiosqlite:///{tmp_path}/calls.db",
                 "sqlite:///calls.db"):
        assert _calls(await asyncio.to_thread(_invoke, "calls", "--json", "--db", form)) == [
            "c-1"], form
    assert _calls(await asyncio.to_thread(_invoke, "calls", "--json",
                                          SESSION_STORE_URL="calls.db")) == ["c-1"]


async def test_a_path_with_url_characters_is_one_path(tmp_path):
    path = tmp_path / "calls?v=1#a b.db"
    made = await asyncio.to_thread(_invoke, "migrate", "--db", str(path))
    assert made.exit_code == 0, made.output
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == [path.name]
    assert _calls(await asyncio.to_thread(_invoke, "calls", "--json", "--db", str(path))) == []


async def test_a_postgresql_url_is_taken_in_the_forms_other_tools_print(migrated):
    if migrated.name != "postgres":
        pytest.skip("PostgreSQL URLs")
    await write_call(migrated, "c-1", failing_call())
    for scheme in ("postgresql", "postgres", "postgresql+asyncpg"):
        url = migrated.url.replace("postgresql+asyncpg", scheme, 1)
        r = await asyncio.to_thread(_invoke, "calls", "--json", "--db", url,
                                    "--schema", migrated.options["schema"])
        assert _calls(r) == ["c-1"], scheme


def test_a_sqlite_file_that_does_not_exist_is_said_to_be_missing(tmp_path, monkeypatch):
    """By its absolute path, for every command that reads; nothing is created."""
    monkeypatch.chdir(tmp_path)
    for command in (["calls"], ["verify"], ["timeline", "c-1"], ["export", "c-1"]):
        for form in ("nowhere.db", "sqlite:///nowhere.db"):
            one_line_error(_invoke(*command, "--db", form),
                            f"the database file {tmp_path}/nowhere.db does not exist")
    one_line_error(_invoke("calls", SESSION_STORE_URL="nowhere.db"), "does not exist")
    assert list(tmp_path.iterdir()) == []


async def test_the_store_says_which_file_is_missing(tmp_path):
    from session_store import SchemaMismatch, open_store

    await upgrade(f"sqlite+aiosqlite:///{tmp_path}/there.db")
    with pytest.raises(SchemaMismatch, match=f"the database file {tmp_path}/nowhere.db does"):
        await open_store(f"sqlite+aiosqlite:///{tmp_path}/nowhere.db")


@pytest.mark.parametrize("value", ["mysql://u@h/db", "http://example.com/a.db",
                                   "sqlite+pysqlite:///a.db", "postgresql+psycopg2://u@h/db",
                                   "postgresql://u:pw-in-url@[::1/db", " "])
def test_what_is_neither_a_path_nor_a_url_the_store_runs_on_is_refused(value, tmp_path,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command in (["calls"], ["migrate"]):
        r = _invoke(*command, "--db", value)
        one_line_error(r)
        assert "pw-in-url" not in r.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_session_store_url_is_refused_not_the_default_database(value, tmp_path,
                                                                        monkeypatch):
    """$SESSION_STORE_URL set to nothing is a mistake, as an empty --db: every command that
    reads it says so (exit 2) instead of opening sessions.db, here one with a call in it
    (issue #35). Click takes an empty variable for an unset one."""
    monkeypatch.chdir(tmp_path)
    asyncio.run(upgrade(f"sqlite+aiosqlite:///{tmp_path}/sessions.db"))
    asyncio.run(write_call(Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path}/sessions.db"),
                           "c-1", failing_call()))
    assert _calls(_invoke("calls", "--json")) == ["c-1"]  # (the default, when unset)
    before = sorted(p.name for p in tmp_path.iterdir())
    for command in (["calls"], ["migrate"], ["verify"], ["timeline", "c-1"], ["state", "c-1"],
                    ["export", "c-1"], ["tail", "c-1"], ["stats"], ["serve", "--port", "0"]):
        r = _invoke(*command, SESSION_STORE_URL=value)
        one_line_error(r, "$SESSION_STORE_URL is empty", unsaid=("c-1",))
    one_line_error(_invoke("calls", "--db", value, SESSION_STORE_URL="sessions.db"),
                   "--db is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_alembic_refuses_an_empty_session_store_url(tmp_path, monkeypatch):
    """`alembic upgrade head` from the checkout: an empty $SESSION_STORE_URL is not
    alembic.ini's database."""
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    from session_store.storage.migrate import ALEMBIC_INI

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SESSION_STORE_URL", "")
    with pytest.raises(CommandError, match=r"\$SESSION_STORE_URL is empty"):
        command.upgrade(Config(str(ALEMBIC_INI)), "head")
    assert list(tmp_path.iterdir()) == []
