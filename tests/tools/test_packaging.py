"""What a user who installs the wheel (not the checkout) gets: the migrations, the viewer's
files, the type marker, a `migrate` that finds its migrations without alembic.ini, and
none of the rig (rig/, tests/, bench/, examples/)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from session_store.storage import migrate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out),
                    str(ROOT)], check=True, timeout=300)
    (built,) = out.glob("*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_carries_every_migration_the_checkout_has(wheel):
    names = set(wheel.namelist())
    revisions = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("*.py"))
    assert revisions, "the checkout has no migrations"
    for revision in revisions:
        assert f"session_store/_migrations/versions/{revision}" in names
    assert "session_store/_migrations/env.py" in names
    assert {"session_store/py.typed", "service/py.typed"} <= names
    assert any(n.startswith("session_store/web/templates/") for n in names)
    assert any(n.startswith("session_store/web/static/") for n in names)


def test_the_wheel_holds_the_product_and_no_rig(wheel):
    names = wheel.namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"session_store", "service"}
    assert "session_store/commands/cli.py" in names and "service/local_live/server.py" in names
    assert [n for n in names if n.startswith(("service/crash/", "service/testing/",
                                              "service/demo.py"))] == []


async def test_an_installed_wheel_migrates_without_alembic_ini(wheel, tmp_path, monkeypatch):
    unpacked = tmp_path / "site"
    wheel.extractall(unpacked)
    monkeypatch.setattr(migrate, "ALEMBIC_INI", tmp_path / "no" / "alembic.ini")
    monkeypatch.setattr(migrate, "PACKAGED_MIGRATIONS",
                        unpacked / "session_store" / "_migrations")
    url = f"sqlite+aiosqlite:///{tmp_path / 'log.db'}"
    script = ScriptDirectory.from_config(migrate.alembic_config(url))
    assert script.dir == str(unpacked / "session_store" / "_migrations")
    await migrate.upgrade(url)
    with sqlite3.connect(tmp_path / "log.db") as db:
        (version,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    assert version == script.get_current_head()


def test_without_migrations_the_error_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(migrate, "ALEMBIC_INI", tmp_path / "alembic.ini")
    monkeypatch.setattr(migrate, "PACKAGED_MIGRATIONS", tmp_path / "_migrations")
    with pytest.raises(FileNotFoundError, match="no migrations"):
        migrate.alembic_config("sqlite+aiosqlite:///x.db")
