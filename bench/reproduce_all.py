"""Every crash-harness scenario's log (and the demo's) reproduced and re-run: green or not.

For each scripted scenario, a call is logged by the crash harness (clean, and with the
demo's kill: the first worker SIGKILLed right after a result's send intent), turned into a
reproduction by `session-store reproduce`, and re-run (service/reproduction.py) on a fresh
database. Prints one line per case and exits 1 if any re-run diverges.

    python bench/reproduce_all.py --db sqlite
    python bench/reproduce_all.py --db postgres
    python bench/reproduce_all.py --db sqlite --fleet 4   # the phone bot's fleet instead
    python bench/reproduce_all.py --db postgres --scenario progress_call --kill clean --runs 30

`--fleet N` runs the phone bot's fleet (examples/phone_bot/fleet.py: 2 workers, N calls, one
worker SIGKILLed mid-tool-call) and reproduces every call the killed worker was serving
(each moved to the other worker) and one that did not move.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rig.crash.case import Kill, run_case
from rig.crash.harness import Databases
from rig.crash.scenarios import SCRIPTED
from service.reproduction import run_reproduction

KILLS = {"clean": [], "demo kill": [Kill(after_event="tool.result_sending")]}


async def one(scenario: str, label: str, dbs: Databases, root: Path) -> bool:
    url, schema = await dbs()
    logged = await run_case(scenario, url, schema=schema, kills=KILLS[label], workdir=root)
    return await rerun(logged.call_id, f"{scenario:16} {label:10} kills {logged.kills}",
                       url, schema, dbs, root)


async def rerun(call: str, label: str, url: str, schema: str | None, dbs: Databases,
                root: Path) -> bool:
    """`session-store reproduce` the call, re-run it on a fresh database, print the verdict."""
    out = root / f"{call}.repro"
    args = ["--db", url] + (["--schema", schema] if schema else [])
    subprocess.run([sys.executable, "-m", "session_store.commands.cli", "reproduce", call,
                    "--out", str(out), *args], check=True, capture_output=True)
    rerun_url, rerun_schema = await dbs()
    t0 = time.monotonic()
    result = await run_reproduction(out, rerun_url, schema=rerun_schema)
    verdict = "green" if result.divergence is None else "RED"
    # The model's messages the log shows came in during a commit (a noted toolCall): how
    # often the call ran that race, beside how often its re-run came out red.
    spec = json.loads((out / "reproduction.json").read_text(encoding="utf-8"))
    during = sum(1 for c in spec["connections"] for s in c["steps"] if s.get("during_commit"))
    print(f"{label}  events {len(result.actual):3}  re-run {time.monotonic() - t0:5.1f} s  "
          f"during a commit {during}  {verdict}", flush=True)
    if result.divergence is not None:
        print("    " + result.divergence.message().replace("\n", "\n    "), flush=True)
        # A red re-run is often a race of the call itself: keep its log to find which.
        kept = Path("reproduce-red") / call
        shutil.copytree(out, kept, dirs_exist_ok=True)
        print(f"    kept: {kept} (re-run it with: pytest {kept})", flush=True)
    return result.divergence is None


async def fleet(db: str, calls: int, dbs: Databases, root: Path) -> bool:
    from examples.phone_bot.fleet import run_fleet

    summary = await run_fleet(db, workers=2, calls=calls, workdir=root / "fleet", quiet=True,
                              keep=True)
    url, schema = summary["db_url"], summary["db_schema"]
    listed = subprocess.run([sys.executable, "-m", "session_store.commands.cli", "calls", "--json",
                             "--limit", str(calls), "--db", url]
                            + (["--schema", schema] if schema else []),
                            check=True, capture_output=True, text=True)
    every = [c["call"] for c in json.loads(listed.stdout)["calls"]]
    moved = summary["affected"]
    if not summary["ok"] or not moved:
        print(f"fleet: not reproduced (ok {summary['ok']}, moved {moved})", flush=True)
        return False
    ok = True
    for call in moved + [c for c in every if c not in moved][:1]:
        kind = "moved" if call in moved else "not moved"
        ok &= await rerun(call, f"phone bot {call} {kind:9}", url, schema, dbs, root)
    return ok


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--scenario", action="append", choices=sorted(SCRIPTED))
    parser.add_argument("--kill", action="append", choices=sorted(KILLS),
                        help="only these kills (default: every one)")
    parser.add_argument("--runs", type=int, default=1,
                        help="each case this many times (a race of the call shows once in N)")
    parser.add_argument("--fleet", type=int, metavar="CALLS",
                        help="reproduce the phone bot fleet's calls instead")
    args = parser.parse_args()
    ok, red, runs = True, 0, 0
    with tempfile.TemporaryDirectory(prefix="reproduce-all-") as tmp:
        dbs = Databases(args.db, Path(tmp))
        try:
            if args.fleet:
                ok = await fleet(args.db, args.fleet, dbs, Path(tmp))
            for _ in range(args.runs) if not args.fleet else ():
                for scenario in args.scenario or SCRIPTED:
                    for label in args.kill or KILLS:
                        green = await one(scenario, label, dbs, Path(tmp))
                        ok &= green
                        red, runs = red + (not green), runs + 1
        finally:
            await dbs.cleanup()
    if runs > 1:
        print(f"{runs} re-runs: {runs - red} green, {red} red", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
