"""One crash case: a scripted call run by worker processes that die where a `Kill` says,
resumed on the same database by fresh workers until one finishes, then checked (I1–I7)
against the local server's record, the tool ledger and the log. The campaigns that run many
cases (every boundary, random soaks) and their command line are harness.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from service.local_live import LocalLiveServer
from session_store import open_store
from session_store.audit.verify import verify_log

from .invariants import check_call
from .scenarios import SCENARIOS, ServerPlan
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
            # A warm pool holds what a worker runs, the store's dialects included: open_store
            # imports its dialect on first use, and SQLAlchemy's asyncio layer costs ~0.2 s.
            _CTX.set_forkserver_preload(["rig.crash.banner", "rig.crash.worker",
                                         "session_store.storage.sqlite.dialect",
                                         "session_store.storage.postgres.dialect"])
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
    commit_ends: list[int] = field(default_factory=list)  # each commit's last version

    @property
    def ok(self) -> bool:
        return not self.violations


async def run_case(scenario_name: str, db_url: str, *, schema: str | None = None,
                   kills: list[Kill] = (), workdir: Path, timeout_s: float = 60.0,
                   max_workers: int = 12, live: LiveTarget | None = None,
                   model: str | None = None, call_id: str | None = None) -> CaseResult:
    """One call: workers run it, dying as `kills` says, until one finishes; then check.
    `call_id`: the call's id (default: the scenario's name and a random suffix).

    Scripted, the call talks to a local Gemini Live server playing the scenario (with the
    wire rules of `model`'s generation), and is checked against that server's record too;
    `live`, it talks to `live` (the real API) and is checked against the log and the tool
    ledger."""
    scenario = SCENARIOS[scenario_name]
    plan = ServerPlan(scenario)
    call_id = call_id or f"{scenario_name}-{uuid.uuid4().hex[:8]}"
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
                               model=live.model if live else model)
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
                # once in the PostgreSQL soak under CI load).
                break
        store = await open_store(db_url, **({"schema": schema} if schema else {}))
        try:
            records = await store.read(call_id)
            reports = await verify_log(store, call_id)
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
    # One append stamps all its events with one time: a new stamp is a new commit.
    ends = [a.version for a, b in zip(records, records[1:])
            if b.recorded_at_us != a.recorded_at_us] + [r.version for r in records[-1:]]
    return CaseResult(scenario_name, call_id, planned, killed, workers, len(records),
                      problems, takeovers, time.monotonic() - started, fired_at, ends)


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
    from loguru import logger

    logger.enable("pipecat")  # (off in the forkserver: rig/crash/banner.py)
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
