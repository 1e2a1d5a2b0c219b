"""Shared fixtures: every storage test runs on SQLite and on PostgreSQL.

PostgreSQL: 127.0.0.1:5432, user postgres, database `test` (override with
SESSION_STORE_TEST_PG). Each test gets its own schema, dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from session_store import open_store
from session_store.storage.migrate import upgrade


# ----------------------------------------------------------------------------- deprecations
# A deprecated API our code or a test calls fails the run (pipecat 1.14 and google-genai move
# on: what they deprecate goes away). Filters cannot make them errors: pipecat warns with
# simplefilter("always"). So the recorded warnings are checked here, also those xdist relays.
_ROOT = Path(__file__).resolve().parent.parent
_OURS = tuple(str(_ROOT / d) for d in ("service", "session_store", "tests", "bench", "examples",
                                       "migrations"))
_our_deprecations: list[str] = []


def pytest_warning_recorded(warning_message, when, nodeid, location):
    if (issubclass(warning_message.category, DeprecationWarning)
            and str(warning_message.filename).startswith(_OURS)):
        _our_deprecations.append(f"{nodeid or when}: {warning_message.filename}:"
                                 f"{warning_message.lineno}: {warning_message.message}")


def pytest_sessionfinish(session, exitstatus):
    if _our_deprecations and not hasattr(session.config, "workerinput"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _our_deprecations and not hasattr(config, "workerinput"):
        terminalreporter.section("deprecated APIs called by our code (fails the run)", red=True)
        for line in sorted(set(_our_deprecations)):
            terminalreporter.line(line)


# ------------------------------------------------------------------------------- scheduling
# The longest tests start first: xdist hands tests out in collection order, and one of
# these started near the end held the whole run back by its own length (its place in the
# alphabet decided when it started). Prefixes of node ids, longest first.
_LONG_FIRST = (
    "tests/crash/test_crash_recovery.py::test_every_boundary_of_every_scenario",
    "tests/tools/test_scale.py::test_a_50k_event_call_opens",
    "tests/tools/test_web.py::test_a_ten_megabyte_event_costs_the_viewer_what_it_shows",
    "tests/tools/test_demo_output.py::test_the_demo_shows_what_timeline_shows_and_what_to_do_next",
    "tests/crash/test_replay_coverage.py",
    "tests/tools/test_big_calls.py",
    "tests/tools/test_end_to_end.py",
    "tests/crash/test_crash_recovery.py::test_random_soak",
    "tests/phone_bot/test_fleet.py",
    "tests/reproduce/test_reproduce.py",
    "tests/architecture/test_types.py",
)


def _start_rank(nodeid: str) -> int:
    return next((i for i, prefix in enumerate(_LONG_FIRST) if nodeid.startswith(prefix)),
                len(_LONG_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _start_rank(item.nodeid))  # stable: the rest keep their order

PG_URL = os.environ.get("SESSION_STORE_TEST_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PG_DSN = PG_URL.replace("postgresql+asyncpg", "postgresql")


@dataclass
class Backend:
    """Where a test's log lives: a URL plus the options that isolate it."""
    name: str
    url: str
    options: dict = field(default_factory=dict)

    async def migrate(self) -> None:
        await upgrade(self.url, schema=self.options.get("schema"))

    async def open(self, **extra):
        return await open_store(self.url, **{**self.options, **extra})

    @property
    def cli_args(self) -> list[str]:
        args = ["--db", self.url]
        if "schema" in self.options:
            args += ["--schema", self.options["schema"]]
        return args


@contextlib.asynccontextmanager
async def empty_database(name: str, tmp_path, **options):
    """An empty, unmigrated database: a SQLite file under tmp_path, or a PostgreSQL schema of
    its own (dropped afterwards); `options` go to every store opened on it."""
    if name == "sqlite":
        yield Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'log.db'}", options)
        return
    schema = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
        yield Backend("postgres", PG_URL, {"schema": schema, **options})
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request, tmp_path):
    """An empty, unmigrated database on each backend."""
    async with empty_database(request.param, tmp_path) as database:
        yield database


@pytest.fixture
async def migrated(backend):
    await backend.migrate()
    return backend


@pytest.fixture
async def store(migrated):
    s = await migrated.open()
    try:
        yield s
    finally:
        await s.close()
