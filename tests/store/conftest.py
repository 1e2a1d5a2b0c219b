"""Store-suite fixtures on top of tests/conftest.py (backend, migrated, store)."""

from __future__ import annotations

import asyncpg
import pytest

from ..conftest import PG_DSN

STUCK_AFTER_S = 30


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "tails: reads the global order (read_all/subscribe); on PostgreSQL it needs "
        "every older transaction in the cluster to finish")


@pytest.fixture(autouse=True)
async def _no_stuck_transaction_in_the_cluster(request):
    """PostgreSQL tailing readers only see rows below the oldest running transaction id in the
    whole cluster. A transaction left open elsewhere (a hung test run, an idle-in-transaction
    session) stalls them; say so plainly instead of failing with an empty read."""
    callspec = getattr(request.node, "callspec", None)
    if (request.node.get_closest_marker("tails") is None or callspec is None
            or callspec.params.get("backend") != "postgres"):
        yield
        return
    conn = await asyncpg.connect(PG_DSN)
    try:
        stuck = await conn.fetch(
            "SELECT pid, datname, state, xact_start, left(query, 100) AS query "
            "FROM pg_stat_activity WHERE backend_xid IS NOT NULL "
            f"AND xact_start < now() - interval '{STUCK_AFTER_S} seconds'")
    finally:
        await conn.close()
    if stuck:
        pytest.fail("PostgreSQL tailing readers are held back by transaction(s) open for more "
                    f"than {STUCK_AFTER_S}s elsewhere in the cluster (end them and re-run): "
                    + "; ".join(f"pid {r['pid']} db {r['datname']} {r['state']} since "
                                f"{r['xact_start']:%H:%M:%S}: {r['query']!r}" for r in stuck),
                    pytrace=False)
    yield
