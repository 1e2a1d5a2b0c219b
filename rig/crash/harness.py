"""Crash campaigns: scripted calls in worker processes, killed, resumed on the same database,
checked (one case: case.py).

Modes:
- every boundary: a clean run logs the call; then for each of its commits the first worker
  SIGKILLs itself right after the log reaches that commit's last version, for each tool it
  dies between the tool's side effect and the append of its outcome, and once it dies in the
  commit of a tool's start (a run must wait for that commit);
- random soak: workers are SIGKILLed from outside at random times.
After each case a fresh worker resumes until the call completes, and I1–I7 are checked
against the server's record, the tool ledger and the log.

    python -m rig.crash.harness --mode boundary --db sqlite
    python -m rig.crash.harness --mode soak --kills 1000 --db postgres
    python -m rig.crash.harness --mode soak --kills 20 --start cold   # fresh interpreters
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from . import case
from .case import CaseResult, Kill, run_case
from .scenarios import SCENARIOS, SCRIPTED, scripted_for


async def commit_ends(scenario: str, new_db, workdir: Path,
                      model: str | None = None) -> list[int]:
    """The last version of each commit the call logs when nothing goes wrong: the points
    between appends where a worker can die. A kill after any version inside a commit lands
    after the whole commit, so one kill per commit covers them all."""
    url, schema = await new_db()
    result = await run_case(scenario, url, schema=schema, workdir=workdir, model=model)
    if not result.ok:
        raise AssertionError(f"{scenario} fails even without a crash: {result.violations}")
    return result.commit_ends


def boundary_kills(scenario: str, commit_ends: list[int]) -> list[list[Kill]]:
    cases = [[Kill(at_version=v)] for v in commit_ends]
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


async def run_many(cases, new_db, workdir: Path, parallel: int = 3,
                   model: str | None = None) -> list[CaseResult]:
    """Run (scenario, kills) cases, `parallel` at a time, each on a fresh database."""
    gate = asyncio.Semaphore(parallel)

    async def one(scenario, kills):
        async with gate:
            url, schema = await new_db()
            try:
                return await run_case(scenario, url, schema=schema, kills=kills,
                                      workdir=workdir, model=model)
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
        from session_store.storage.migrate import upgrade
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


async def run_boundaries(scenarios, new_db, workdir: Path, parallel: int = 3,
                         model: str | None = None) -> list[CaseResult]:
    cases = []
    for s in scenarios:
        ends = await commit_ends(s, new_db, workdir, model)
        cases += [(s, k) for k in boundary_kills(s, ends)]
    return await run_many(cases, new_db, workdir, parallel, model)


async def run_soak(scenarios, kills: int, new_db, workdir: Path, parallel: int = 3,
                   seed: int = 1, model: str | None = None) -> list[CaseResult]:
    """Random SIGKILLs from outside until `kills` workers have really died mid-call."""
    rng = random.Random(seed)
    results: list[CaseResult] = []
    while sum(r.kills for r in results) < kills:
        batch = [(rng.choice(scenarios),
                  [Kill(after_s=rng.uniform(0.2, 2.5)) for _ in range(rng.randint(1, 3))])
                 for _ in range(parallel * 2)]
        results += await run_many(batch, new_db, workdir, parallel, model)
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
    from rig.testing.pipeline import MODEL

    parser.add_argument("--model", default=MODEL,
                        help="the Gemini Live model the calls name: the local server applies "
                             "its generation's wire rules (default: %(default)s)")
    parser.add_argument("--start", choices=["warm", "cold"], default="warm",
                        help="workers fork from a preloaded server (warm) or start a fresh "
                             "interpreter each (cold: takeover times include start-up)")
    args = parser.parse_args()
    case.START = args.start
    scenarios = args.scenario or sorted(scripted_for(args.model))
    with tempfile.TemporaryDirectory(prefix="crash-harness-") as tmp:
        root = Path(args.workdir) if args.workdir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        new_db = Databases(args.db, root)
        t0 = time.monotonic()
        try:
            if args.mode == "boundary":
                results = await run_boundaries(scenarios, new_db, root, args.parallel,
                                               args.model)
            else:
                results = await run_soak(scenarios, args.kills, new_db, root, args.parallel,
                                         args.seed, args.model)
        finally:
            await new_db.cleanup()
        summary = summarise(results)
        summary["wall_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(summary, indent=2))
        return 1 if summary["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(_main()))
