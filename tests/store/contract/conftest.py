"""The storage contract: every test in this directory runs once on each backend of BACKENDS.

As an abstract recorder test case runs once per concrete recorder: the contract is written
once against `backend`/`migrated`/`store` (tests/conftest.py), and this fixture makes it a
suite per backend. A backend's own behaviour (SQLite's writer process, inline commits, WAL;
PostgreSQL's writer connections, NOTIFY, tailing behind open transactions) is tested in
tests/store/sqlite and tests/store/postgres instead.
"""

from __future__ import annotations

import pytest

from ...conftest import empty_database

#: id -> (database, options every store of the test is opened with). "sqlite-inline": every
#: append that finds the store idle commits on the event loop's thread (a budget no machine
#: exceeds, so the path does not depend on the machine's load).
BACKENDS = {"sqlite": ("sqlite", {}),
            "sqlite-inline": ("sqlite", {"inline": "always", "inline_budget": 60.0}),
            "postgres": ("postgres", {})}


@pytest.fixture(params=list(BACKENDS))
async def backend(request, tmp_path):
    name, options = BACKENDS[request.param]
    async with empty_database(name, tmp_path, **options) as database:
        yield database
