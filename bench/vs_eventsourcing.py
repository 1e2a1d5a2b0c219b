"""Our store against the `eventsourcing` library's recorders, same append workload, same run.

For 1 and 16 concurrent writers, on SQLite and PostgreSQL, each writer appends the same
~200-byte event to its own stream, one event per append (= per transaction), as fast as it
can. Ours: `store.append` from asyncio tasks (group commit shares transactions between
writers). eventsourcing (>= 9.3, a benchmark-only dependency: `pip install -e '.[bench]'`):
its recorders' `insert_events` called directly with one StoredEvent each, from one thread per
writer (the library is synchronous), on
- ApplicationRecorder: like ours it gives a global order to tail (notification ids); on
  PostgreSQL it takes `LOCK TABLE ... IN EXCLUSIVE MODE` per insert to keep that order safe;
- AggregateRecorder: per-stream order only (no global order; for reference).
Durability is the same everywhere: SQLite WAL with synchronous=FULL (its default, checked),
PostgreSQL synchronous_commit=on. The implementations run in interleaved rounds, each on a
fresh database; prints the median events/s, p50/p99 of one append and ours/theirs.

    python bench/vs_eventsourcing.py            # full
    python bench/vs_eventsourcing.py --quick    # CI: fewer events
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
import uuid


from callmix import (PG_DSN, PG_URL, drop_schema, machine, ms, pct, pg_reachable,
                     pg_schema)
from session_store import open_store
from session_store.events import ConversationMessage, canonical_json
from session_store.storage.migrate import upgrade

TEXT = "The order 48213 shipped on Tuesday and should arrive by Friday, tracking 1Z999." * 2
EVENT = ConversationMessage("assistant", TEXT[:150], 1)
PAYLOAD = canonical_json(EVENT.to_data())  # ~190 bytes, as in bench/append.py
TOPIC = "session_store.events:ConversationMessage"

try:
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.sqlite import (SQLiteAggregateRecorder, SQLiteApplicationRecorder,
                                      SQLiteDatastore)
    ES_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - depends on the environment
    ES_IMPORT_ERROR = exc
try:
    from eventsourcing.postgres import (PostgresAggregateRecorder, PostgresApplicationRecorder,
                                        PostgresDatastore)
    ES_PG_IMPORT_ERROR = ES_IMPORT_ERROR
except ImportError as exc:  # pragma: no cover - psycopg missing
    ES_PG_IMPORT_ERROR = exc


# ------------------------------------------------------------------ eventsourcing

def es_recorder(backend: str, kind: str, target: str, writers: int):
    if backend == "sqlite":
        datastore = SQLiteDatastore(target, pool_size=writers, max_overflow=0, lock_timeout=60)
        cls = SQLiteApplicationRecorder if kind == "application" else SQLiteAggregateRecorder
    else:
        from sqlalchemy.engine import make_url
        u = make_url(PG_URL)
        datastore = PostgresDatastore(u.database, u.host, u.port or 5432, u.username or "",
                                      u.password or "", pool_size=writers, max_overflow=0,
                                      schema=target)
        cls = PostgresApplicationRecorder if kind == "application" else PostgresAggregateRecorder
    recorder = cls(datastore)
    recorder.create_table()
    return recorder, datastore


def run_es(backend: str, kind: str, target: str, writers: int, per_writer: int):
    recorder, datastore = es_recorder(backend, kind, target, writers)
    if backend == "sqlite":  # same durability as ours: check, do not assume
        with datastore.transaction(commit=False) as cur:
            cur.execute("PRAGMA synchronous")
            assert cur.fetchone()[0] == 2, "eventsourcing's SQLite connections are not FULL"
    state = PAYLOAD.encode()
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(writers + 1)

    def writer() -> None:
        stream = uuid.uuid4()
        mine = []
        barrier.wait()
        for v in range(1, per_writer + 1):
            t = time.perf_counter()
            recorder.insert_events([StoredEvent(stream, v, TOPIC, state)])
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=writer) for _ in range(writers)]
    for th in threads:
        th.start()
    barrier.wait()
    start = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start
    datastore.close()
    return elapsed, latencies


# ------------------------------------------------------------------ ours

async def run_ours(url: str, options: dict, writers: int, per_writer: int):
    store = await open_store(url, **options)
    latencies: list[float] = []

    async def writer(n: int) -> None:
        version = 0
        for _ in range(per_writer):
            t = time.perf_counter()
            version = await store.append(f"w{n}", [EVENT], version)
            latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(writer(n) for n in range(writers)))
    elapsed = time.perf_counter() - start
    await store.close()
    return elapsed, latencies


def summary(runs: list[tuple[float, list[float]]]) -> dict:
    """Median events/s over the rounds; latency percentiles over every append of them."""
    latencies = [x for _, lat in runs for x in lat]
    return {"eps": round(statistics.median(len(lat) / t for t, lat in runs)),
            "p50_ms": ms(pct(latencies, 50)), "p99_ms": ms(pct(latencies, 99))}


async def one_round(backend: str, writers: int, per_writer: int, runs: dict) -> None:
    """Ours, then each eventsourcing recorder, each on a fresh database."""
    es_error = ES_IMPORT_ERROR if backend == "sqlite" else ES_PG_IMPORT_ERROR
    with tempfile.TemporaryDirectory() as tmp:
        schemas = [await pg_schema() for _ in range(3)] if backend == "postgres" else []
        try:
            if backend == "sqlite":
                url, options = f"sqlite+aiosqlite:///{tmp}/ours.db", {}
                await upgrade(url)
                targets = {"application": f"{tmp}/es_app.db", "aggregate": f"{tmp}/es_agg.db"}
            else:
                url, options = PG_URL, {"schema": schemas[0]}
                await upgrade(url, schema=schemas[0])
                targets = {"application": schemas[1], "aggregate": schemas[2]}
            runs.setdefault("ours", []).append(await run_ours(url, options, writers, per_writer))
            if es_error is None:
                for kind, target in targets.items():
                    runs.setdefault(kind, []).append(await asyncio.to_thread(
                        run_es, backend, kind, target, writers, per_writer))
        finally:
            for s in schemas:
                await drop_schema(s)


async def run_one(backend: str, writers: int, total: int, rounds: int) -> dict:
    """Rounds interleave the implementations, so a slow spell of the disk (this machine is
    shared) hits all of them alike instead of whichever ran during it."""
    per_writer = max(total // writers, 2)
    row: dict = {"backend": backend, "writers": writers, "events": per_writer * writers,
                 "rounds": rounds}
    runs: dict[str, list] = {}
    for _ in range(rounds):
        await one_round(backend, writers, per_writer, runs)
    for impl, results in runs.items():
        row[impl] = summary(results)
    for kind in ("application", "aggregate"):
        if kind in row:
            row[f"ours_over_{kind}"] = round(row["ours"]["eps"] / row[kind]["eps"], 2)
    return row


def print_row(row: dict) -> None:
    for impl in ("ours", "application", "aggregate"):
        if impl not in row:
            continue
        r = row[impl]
        ratio = f"{row[f'ours_over_{impl}']:>7.2f}x" if impl != "ours" else ""
        name = "ours" if impl == "ours" else f"es {impl}"
        print(f"{row['backend']:8} {row['writers']:>7} {name:15} {r['eps']:>8} "
              f"{r['p50_ms']:>7.2f} {r['p99_ms']:>8.2f} {ratio}", flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events (CI)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    totals = {1: 300, 16: 1600} if args.quick else {1: 1000, 16: 4000}
    rounds = 1 if args.quick else 5
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    if ES_IMPORT_ERROR is not None:
        print(f"eventsourcing not importable ({ES_IMPORT_ERROR}): comparison skipped; install "
              "it with `pip install -e '.[bench]'`. Only our figures are printed.")
    elif ES_PG_IMPORT_ERROR is not None and "postgres" in backends:
        print(f"eventsourcing.postgres not importable ({ES_PG_IMPORT_ERROR}; it needs psycopg "
              "3: `pip install 'eventsourcing[postgres]'`): PostgreSQL comparison skipped.")
    if "postgres" in backends and not await pg_reachable():
        print(f"PostgreSQL not reachable at {PG_DSN}: skipping it")
        backends.remove("postgres")
    print(machine())
    print(f"one ~200-byte event per append; each writer its own stream; {rounds} interleaved "
          "round(s): median events/s, latency over all rounds; ours/es = events/s ratio")
    print(f"{'backend':8} {'writers':>7} {'impl':15} {'ev/s':>8} {'p50 ms':>7} {'p99 ms':>8} "
          f"{'ours/es':>8}")
    rows = []
    for backend in backends:
        for writers, total in totals.items():
            rows.append(await run_one(backend, writers, total, rounds))
            print_row(rows[-1])
    print(f"after: {machine()}")
    print(json.dumps({"bench": "vs_eventsourcing", "quick": args.quick,
                      "eventsourcing": None if ES_IMPORT_ERROR else _es_version(),
                      "rows": rows}))


def _es_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("eventsourcing")
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    asyncio.run(main())
