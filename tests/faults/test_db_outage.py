"""Database outage (issue #6): the database goes away while 100 calls append, and comes back.

- PostgreSQL: a private cluster (tests/faults/pgcluster.py) is stopped (`immediate`: a crash,
  `fast`: an orderly shutdown that cuts every client) and restarted mid-run.
- SQLite: the disk fills up, or the database becomes unwritable, mid-run.

Throughout: every acknowledged append is in the log afterwards, exactly; an append issued
during the outage either succeeds after recovery or fails with StoreUnavailable after its own
bounded wait (never silently); the store recovers without being reopened; versions are
gap-free and every hash chain verifies (tests/faults/load.py, `check_log`). Each test also
asserts that the fault really happened (retries counted, appends that waited it out).

CI runs the short versions; `LONG_FAULTS=1` runs the long ones (several restarts, minutes):

    LONG_FAULTS=1 python -m pytest tests/faults -k long -s
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

import pytest

from session_store import open_store
from session_store.migrate import upgrade

from .load import Load, check_log
from .sqlitefaults import CannotFault, TinyDisk, Unwritable, check_immutable_works

LONG = os.environ.get("LONG_FAULTS") == "1"
long_only = pytest.mark.skipif(not LONG, reason="long fault run: set LONG_FAULTS=1")

pytestmark = pytest.mark.timeout(600 if LONG else 180)


def report(name: str, figures: dict) -> None:
    """The figures of a run, one JSON line (read them with -s)."""
    print(f"\n[{name}] " + json.dumps(figures))


# --------------------------------------------------------------------------- PostgreSQL

async def _pg_restarts(private_pg, pg_store_factory, plan: list[tuple[str, float, float]],
                       *, tail: float, calls: int = 100) -> dict:
    """100 calls on one store while the cluster is restarted per `plan`: (mode, seconds of
    load before the stop, seconds down)."""
    store = await pg_store_factory()
    load = Load(store, calls=calls)
    outages = []

    async def fault():
        for mode, before, down in plan:
            await asyncio.sleep(before)
            outages.append(await private_pg.restart(mode, down))
        await asyncio.sleep(tail)  # the same store carries on after the last recovery

    await load.run(fault)
    figures = await check_log(store, load)

    # The outage really happened and the store rode it out without being reopened.
    assert store.stats["retries"] > 0, "no append was ever retried: was the database down?"
    for o in outages:
        during = load.issued_between(o.stop_at, o.up_at)
        assert during, f"no append was issued during the {o.mode} outage"
        waited = [a for a in during if a.acknowledged and a.ended >= o.down_at]
        assert waited, f"no append issued during the {o.mode} outage was acknowledged after it"
    last = outages[-1]
    after = [a for a in load.issued_between(last.up_at + 0.5, time.monotonic())
             if a.acknowledged]
    assert after, "nothing was appended after the last recovery"
    figures.update(outages=[{"mode": o.mode, "down_s": round(o.duration, 2)} for o in outages],
                   retries=store.stats["retries"],
                   issued_during_outages=sum(len(load.issued_between(o.stop_at, o.up_at))
                                             for o in outages))
    return figures


async def test_postgres_restart_while_100_calls_append(private_pg, pg_store_factory):
    figures = await _pg_restarts(private_pg, pg_store_factory,
                                 [("immediate", 4.0, 2.5)], tail=4.0)
    report("pg restart", figures)
    assert figures["failed"] > 0, "no short-deadline append failed: the outage was too short"


@long_only
async def test_long_postgres_restarts(private_pg, pg_store_factory):
    plan = [("immediate", 10.0, 2.0), ("fast", 15.0, 5.0), ("immediate", 15.0, 10.0),
            ("fast", 15.0, 1.0), ("immediate", 15.0, 35.0)]  # the last outlasts the 30 s default
    figures = await _pg_restarts(private_pg, pg_store_factory, plan, tail=15.0)
    report("pg long", figures)


# --------------------------------------------------------------------------- SQLite

async def _sqlite_faults(store, db_path, fault_cm, plan: list[tuple[float, float]], *,
                         tail: float, calls: int = 100) -> dict:
    """100 calls on one SQLite store while `fault_cm()` holds, per `plan`: (seconds of load
    before, seconds held)."""
    load = Load(store, calls=calls)
    windows = []

    async def fault():
        for before, hold in plan:
            await asyncio.sleep(before)
            start = time.monotonic()
            with fault_cm():
                await asyncio.sleep(hold)
            windows.append((start, time.monotonic()))
        await asyncio.sleep(tail)

    await load.run(fault)
    figures = await check_log(store, load)
    assert store.stats["retries"] > 0, "no append was ever retried: did the fault bite?"
    for start, end in windows:
        hit = [a for a in load.issued_between(start, end)
               if a.error is not None or a.ended > end]
        assert hit, "no append issued during the fault failed or waited it out"
    after = [a for a in load.issued_between(windows[-1][1] + 0.5, time.monotonic())
             if a.acknowledged]
    assert after, "nothing was appended after the fault was lifted"
    errors = sorted({str(a.error) for a in load.appends if a.error is not None})
    figures.update(retries=store.stats["retries"], errors=errors[:3],
                   held_s=[round(e - s, 2) for s, e in windows])
    return figures


@pytest.fixture
def tiny_disk(tmp_path):
    disk = TinyDisk(tmp_path / "disk")
    try:
        disk.__enter__()
    except CannotFault as exc:
        pytest.skip(str(exc))
    try:
        yield disk
    finally:
        disk.__exit__()


@pytest.fixture
def unwritable_dir(tmp_path):
    directory = tmp_path / "db"
    directory.mkdir()
    try:
        check_immutable_works(directory)
    except CannotFault as exc:
        pytest.skip(str(exc))
    return directory


@contextlib.asynccontextmanager
async def sqlite_store(directory):
    url = f"sqlite+aiosqlite:///{directory / 'log.db'}"
    await upgrade(url)
    store = await open_store(url)
    try:
        yield store
    finally:
        await store.close()


async def test_sqlite_disk_full_while_100_calls_append(tiny_disk):
    async with sqlite_store(tiny_disk.path) as store:
        @contextlib.contextmanager
        def disk_full():
            tiny_disk.fill()
            try:
                yield
            finally:
                tiny_disk.free()

        figures = await _sqlite_faults(store, tiny_disk.path / "log.db", disk_full,
                                       [(3.0, 2.5)], tail=4.0)
    report("sqlite disk full", figures)
    assert figures["failed"] > 0
    assert all("disk is full" in e for e in figures["errors"]), figures["errors"]


async def test_sqlite_unwritable_while_100_calls_append(unwritable_dir):
    db = unwritable_dir / "log.db"
    async with sqlite_store(unwritable_dir) as store:
        figures = await _sqlite_faults(store, db, lambda: Unwritable(db), [(3.0, 2.5)],
                                       tail=4.0)
    report("sqlite unwritable", figures)
    assert figures["failed"] > 0
