"""Run scripted calls in worker processes, kill them, resume on the same database, check.

Modes:
- every boundary: a clean run counts the events V the first worker appends; then for each
  v in 1..V the first worker SIGKILLs itself right after the log reaches v, for each
  tool it dies between the tool's side effect and the append of its outcome, and once it
  dies in the commit of a tool's start (a run must wait for that commit);
- random soak: workers are SIGKILLed from outside at random times.
After each case a fresh worker resumes until the call completes, and I1–I7 are checked
against the server's record, the tool ledger and the log.

    python -m service.crash.harness --mode boundary --db sqlite
    python -m service.crash.harness --mode soak --kills 1000 --db postgres
    python -m service.crash.harness --mode soak --kills 20 --start cold   # fresh interpreters
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from service.local_live import LocalLiveServer
from session_store import open_store

from .invariants import check_call
from .scenarios import SCENARIOS, SCRIPTED, ServerPlan
from .worker import WorkerConfig

_CTX = None
# "warm": workers fork from a server process that has pipecat imported (a pre-warmed worker
# pool, as a deployment would keep): real processes that start in milliseconds. "cold": every
# worker is a fresh interpreter that imports everything (the worst case of a takeover).
START = "warm"


def _context():
    global _CTX
    if _CTX is None:
        if START == "cold":
            _CTX = multiprocessing.get_context("spawn")
        else:
            _CTX = multiprocessing.get_context("forkserver")
            _CTX.set_forkserver_preload(["service.crash.worker"])
    return _CTX


@dataclass
class Kill:
    at_version: int | None = None
    in_tool: str | None = None
    after_s: float | None = None  # external SIGKILL after this many seconds
    after_event: str | None = None  # right after the first append of this event type
    before_event: str | None = None  # in the first append of this event type, before it commits

    def label(self) -> str:
        if self.at_version is not None:
            return f"after v{self.at_version}"
        if self.after_event:
            return f"after {self.after_event}"
        if self.before_event:
            return f"before {self.before_event}"
        if self.in_tool:
            return f"inside {self.in_tool}"
        return f"after {self.after_s:.2f}s" if self.after_s is not None else "none"

    @property
    def by_worker(self) -> bool:
        """The worker kills itself at a point of its own (and records where it died)."""
        return bool(self.at_version is not None or self.in_tool or self.after_event
                    or self.before_event)


@dataclass(frozen=True)
class LiveTarget:
    """Where live workers connect: the real Gemini Live API (no base URL), or any endpoint
    that speaks its protocol (a proxy; in tests, the local server). The API key is never
    here: workers read GOOGLE_API_KEY from their environment."""

    base_url: str | None = None
    cert_path: str | None = None
    model: str | None = None


@dataclass
class CaseResult:
    scenario: str
    call_id: str
    kills_planned: list[str]
    kills: int
    workers: int
    events: int
    violations: list[str]
    takeover_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    kills_fired: list[str] = field(default_factory=list)  # where each worker really died

    @property
    def ok(self) -> bool:
        return not self.violations


async def run_case(scenario_name: str, db_url: str, *, schema: str | None = None,
                   kills: list[Kill] = (), workdir: Path, timeout_s: float = 60.0,
                   max_workers: int = 12, live: LiveTarget | None = None) -> CaseResult:
    """One call: workers run it, dying as `kills` says, until one finishes; then check.

    Scripted, the call talks to a local Gemini Live server playing the scenario, and is
    checked against that server's record too; `live`, it talks to `live` (the real API) and
    is checked against the log and the tool ledger."""
    scenario = SCENARIOS[scenario_name]
    plan = ServerPlan(scenario)
    call_id = f"{scenario_name}-{uuid.uuid4().hex[:8]}"
    ledger = workdir / f"{call_id}.ledger.jsonl"
    started = time.monotonic()
    planned = [k.label() for k in kills]
    kills = list(kills)
    killed, workers, takeovers, fired_at, unfired = 0, 0, [], [], []
    local = contextlib.nullcontext() if live else LocalLiveServer(plan.script)
    async with local as server:
        while True:
            if workers >= max_workers:
                raise RuntimeError(f"{call_id}: no worker finished after {workers} tries")
            kill = kills.pop(0) if kills else Kill()
            base_url, cert = (live.base_url, live.cert_path) if live else \
                (server.base_url, str(server.cert_path))
            cfg = WorkerConfig(db_url, call_id, scenario_name, base_url, cert, str(ledger),
                               schema=schema, kill_at_version=kill.at_version,
                               kill_in_tool=kill.in_tool, kill_after_event=kill.after_event,
                               kill_before_event=kill.before_event,
                               kill_record=str(workdir / f"{call_id}.worker{workers + 1}.killed"),
                               timeout_s=timeout_s, live=live is not None,
                               model=live.model if live else None)
            log_path = workdir / f"{call_id}.worker{workers + 1}.log"
            proc = _context().Process(target=_worker_entry, args=(asdict(cfg), str(log_path)),
                                      daemon=True)
            t0, seen = time.time(), len(server.connections) if server else 0
            proc.start()
            workers += 1
            outside = False
            if kill.after_s is not None:
                await asyncio.to_thread(proc.join, kill.after_s)
                if proc.exitcode is None:
                    proc.kill()
                    outside = True
            await asyncio.to_thread(proc.join, timeout_s + 10)
            if proc.exitcode is None:
                proc.kill()
                raise RuntimeError(f"{call_id}: worker hung ({kill.label()}); log: {log_path}")
            if workers > 1:
                first = _first_action_after(server, seen, t0) if server else \
                    await _first_send_in_log(db_url, schema, call_id, t0)
                if first is not None:
                    takeovers.append(first)
            exitcode = proc.exitcode
            # Where the worker says it died, right before its planned SIGKILL (None: it did
            # not kill itself). A case used to count any -9 as its kill, and a planned kill
            # that never fired left a clean run that passed as a crash case.
            record = Path(cfg.kill_record)
            fired = record.read_text() if record.exists() else None
            if exitcode == 255 and fired is None \
                    and await _call_closed(db_url, schema, call_id):
                # The fork server sometimes loses a child's status and reports 255 (seen under
                # load); the log says whether the worker finished the call.
                exitcode = 0
            if exitcode == 0:
                if kill.by_worker:
                    unfired.append(kill)
                break
            # 255: the fork server could not read the status of a worker that died by our
            # SIGKILL (seen under load); a SIGKILL nobody planned is a failure like any other.
            died_by_kill = exitcode in (-9, 255) and (fired is not None or outside)
            if not died_by_kill:
                raise RuntimeError(f"{call_id}: worker failed with exit code {exitcode}; "
                                   f"log: {log_path}")
            killed += 1
            fired_at.append(f"{kill.label()}: {fired or 'killed from outside'}")
            if outside and await _call_closed(db_url, schema, call_id):
                # Killed from outside while it shut down after ending the call: the call is
                # done, and a new worker would rightly refuse it (CallClosed, exit 1; seen
                # once in the PostgreSQL soak under CI load, stop 21).
                break
        store = await open_store(db_url, **({"schema": schema} if schema else {}))
        try:
            records = await store.read(call_id)
            reports = await store.verify(call_id)
        finally:
            await store.close()
        entries = [json.loads(line) for line in ledger.read_text().splitlines()] \
            if ledger.exists() else []
        problems = check_call(scenario, records, reports, server, entries)
        # A kill point the worker never reached is not a crash case. Only a kill after a
        # version the call never got to may not fire (runs differ in length).
        problems += [f"harness: kill {k.label()} never fired (the call ended at "
                     f"v{len(records)})" for k in unfired
                     if k.at_version is None or len(records) >= k.at_version]
        if problems and server:  # keep what the server saw, next to the worker logs
            server.dump(workdir / f"{call_id}.server.json")
    return CaseResult(scenario_name, call_id, planned, killed, workers, len(records),
                      problems, takeovers, time.monotonic() - started, fired_at)


async def _call_closed(db_url: str, schema: str | None, call_id: str) -> bool:
    store = await open_store(db_url, **({"schema": schema} if schema else {}))
    try:
        return any(r.type == "session.closed" for r in await store.read(call_id))
    finally:
        await store.close()


async def _first_send_in_log(db_url: str, schema: str | None, call_id: str,
                             t0: float) -> float | None:
    """Without a server record (live): seconds from starting a worker to the first send it
    confirmed in the log (a seed or a result) — an upper bound of the caller's pause."""
    store = await open_store(db_url, **({"schema": schema} if schema else {}))
    try:
        for record in await store.read(call_id):
            at = record.recorded_at_us / 1e6
            if record.type == "tool.result_sent" and at >= t0:
                return at - t0
        return None
    finally:
        await store.close()


def _worker_entry(cfg: dict, log_path: str) -> None:
    """Runs in the worker process: its output goes to its own log file."""
    import os
    import sys

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    from .worker import main
    main(cfg)


def _first_action_after(server, first_connection: int, t0: float) -> float | None:
    """Seconds from starting a worker to the first thing it sent after setup (a seed,
    a result): the caller-visible pause of a takeover."""
    for conn in server.connections[first_connection:]:
        for msg in conn.received:
            if msg.kind != "setup" and msg.at >= t0:
                return msg.at - t0
    return None


async def count_events(scenario: str, new_db, workdir: Path) -> int:
    """Events the first worker appends when nothing goes wrong (the boundaries to kill at)."""
    url, schema = await new_db()
    result = await run_case(scenario, url, schema=schema, workdir=workdir)
    if not result.ok:
        raise AssertionError(f"{scenario} fails even without a crash: {result.violations}")
    return result.events


def boundary_kills(scenario: str, events: int) -> list[list[Kill]]:
    cases = [[Kill(at_version=v)] for v in range(1, events + 1)]
    cases += [[Kill(in_tool=name)] for name in SCENARIOS[scenario].tool_names]
    # Dying in the commit of a start: a kill after an append lands once it has committed,
    # and commits are quicker than the tools, so a tool run before its start was logged
    # (no write-ahead) went unseen. Here such a run is in the ledger, and its start is not.
    cases.append([Kill(before_event="tool.call_started")])
    # Dying after a result went out and before the log took its confirmation (noted, and
    # committed with the next append): the send is in doubt, the model may hold the result,
    # and the next worker must deliver it exactly once. No kill after an append lands there.
    cases.append([Kill(before_event="tool.result_sent")])
    return cases


async def run_many(cases, new_db, workdir: Path, parallel: int = 3) -> list[CaseResult]:
    """Run (scenario, kills) cases, `parallel` at a time, each on a fresh database."""
    gate = asyncio.Semaphore(parallel)

    async def one(scenario, kills):
        async with gate:
            url, schema = await new_db()
            try:
                return await run_case(scenario, url, schema=schema, kills=kills, workdir=workdir)
            except Exception as exc:  # noqa: BLE001 - a stuck or failed case is a finding
                return CaseResult(scenario, "?", [k.label() for k in kills], 0, 0, 0,
                                  [f"harness: {exc}"])

    return await asyncio.gather(*(one(s, k) for s, k in cases))


def summarise(results: list[CaseResult]) -> dict:
    takeovers = sorted(t for r in results for t in r.takeover_s)

    def pct(q: float) -> float | None:
        if not takeovers:
            return None
        return takeovers[min(len(takeovers) - 1, int(q * len(takeovers)))]

    return {"cases": len(results), "kills": sum(r.kills for r in results),
            "violations": [f"{r.call_id} [{', '.join(r.kills_planned)}]: {v}"
                           for r in results for v in r.violations],
            "takeover_p50_s": pct(0.5), "takeover_p99_s": pct(0.99),
            "takeover_mean_s": statistics.fmean(takeovers) if takeovers else None}


# ------------------------------------------------------------------ command line

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


class Databases:
    """Fresh, migrated databases for cases: SQLite files under `root`, or PostgreSQL schemas
    (dropped again by `cleanup`)."""

    def __init__(self, kind: str, root: Path, pg_url: str = PG_URL):
        self.kind, self.root, self.pg_url = kind, root, pg_url
        self.schemas: list[str] = []

    async def __call__(self) -> tuple[str, str | None]:
        from session_store.migrate import upgrade
        if self.kind == "sqlite":
            url = f"sqlite+aiosqlite:///{self.root / uuid.uuid4().hex}.db"
            await upgrade(url)
            return url, None
        import asyncpg
        schema = f"crash_{uuid.uuid4().hex[:10]}"
        conn = await asyncpg.connect(self.pg_url.replace("+asyncpg", ""))
        try:
            await conn.execute(f"CREATE SCHEMA {schema}")
        finally:
            await conn.close()
        self.schemas.append(schema)
        await upgrade(self.pg_url, schema=schema)
        return self.pg_url, schema

    async def cleanup(self) -> None:
        if not self.schemas:
            return
        import asyncpg
        conn = await asyncpg.connect(self.pg_url.replace("+asyncpg", ""))
        try:
            for schema in self.schemas:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        finally:
            await conn.close()
        self.schemas.clear()


async def run_boundaries(scenarios, new_db, workdir: Path, parallel: int = 3
                         ) -> list[CaseResult]:
    cases = []
    for s in scenarios:
        cases += [(s, k) for k in boundary_kills(s, await count_events(s, new_db, workdir))]
    return await run_many(cases, new_db, workdir, parallel)


async def run_soak(scenarios, kills: int, new_db, workdir: Path, parallel: int = 3,
                   seed: int = 1) -> list[CaseResult]:
    """Random SIGKILLs from outside until `kills` workers have really died mid-call."""
    rng = random.Random(seed)
    results: list[CaseResult] = []
    while sum(r.kills for r in results) < kills:
        batch = [(rng.choice(scenarios),
                  [Kill(after_s=rng.uniform(0.2, 2.5)) for _ in range(rng.randint(1, 3))])
                 for _ in range(parallel * 2)]
        results += await run_many(batch, new_db, workdir, parallel)
    return results


async def _main() -> int:
    parser = argparse.ArgumentParser(description="crash harness")
    parser.add_argument("--mode", choices=["boundary", "soak"], default="boundary")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--scenario", action="append", choices=sorted(SCRIPTED))
    parser.add_argument("--kills", type=int, default=20,
                        help="soak: run cases until at least this many kills (the cases "
                             "under way then may add a few)")
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", help="keep databases, ledgers and worker logs here")
    parser.add_argument("--start", choices=["warm", "cold"], default="warm",
                        help="workers fork from a preloaded server (warm) or start a fresh "
                             "interpreter each (cold: takeover times include start-up)")
    args = parser.parse_args()
    global START
    START = args.start
    scenarios = args.scenario or sorted(SCRIPTED)
    with tempfile.TemporaryDirectory(prefix="crash-harness-") as tmp:
        root = Path(args.workdir) if args.workdir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        new_db = Databases(args.db, root)
        t0 = time.monotonic()
        try:
            if args.mode == "boundary":
                results = await run_boundaries(scenarios, new_db, root, args.parallel)
            else:
                results = await run_soak(scenarios, args.kills, new_db, root, args.parallel,
                                         args.seed)
        finally:
            await new_db.cleanup()
        summary = summarise(results)
        summary["wall_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(summary, indent=2))
        return 1 if summary["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(_main()))
