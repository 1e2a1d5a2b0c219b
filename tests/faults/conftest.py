"""Fixtures of the fault tests: a private PostgreSQL cluster they may crash and restart.

`LONG_FAULTS=1` (or `-m long_faults`... see test_db_outage.py) turns on the long versions.
"""

from __future__ import annotations

import uuid

import pytest

from sqlalchemy.engine import make_url

from session_store import open_store
from session_store.storage.migrate import upgrade

from .netproxy import PartitionProxy
from .pgcluster import find_pg_bin, start_private_cluster
from .sqlitefaults import CannotFault, check_immutable_works


@pytest.fixture(scope="session")
def private_pg():
    """A throwaway PostgreSQL cluster on a free port (never the shared one on 5432)."""
    bindir, why = find_pg_bin()
    if bindir is None:
        pytest.skip(f"cannot start a private PostgreSQL cluster: {why}")
    cluster = start_private_cluster()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
async def pg_store_factory(private_pg):
    """Opens stores on a fresh migrated schema of the private cluster; closes them after."""
    schema = f"f_{uuid.uuid4().hex[:12]}"
    await private_pg.create_schema(schema)
    await upgrade(private_pg.url, schema=schema)
    opened = []

    async def factory(*, via: PartitionProxy | None = None, **options):
        """`via`: open it through this proxy (tests/faults/netproxy.py) to the cluster."""
        url = private_pg.url
        if via is not None:
            url = make_url(url).set(port=via.port).render_as_string(hide_password=False)
        store = await open_store(url, schema=schema, **options)
        opened.append(store)
        return store

    try:
        yield factory
    finally:
        for store in opened:
            await store.close()


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory for a SQLite database that `sqlitefaults.Unwritable` can make unwritable
    (skips where the filesystem does not enforce `chattr +i` on open files)."""
    directory = tmp_path / "db"
    directory.mkdir()
    try:
        check_immutable_works(directory)
    except CannotFault as exc:
        pytest.skip(str(exc))
    return directory
