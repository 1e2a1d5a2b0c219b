"""Every crash-harness scenario's log (and the demo's) reproduced and re-run: green or not.

For each scripted scenario, a call is logged by the crash harness (clean, and with the
demo's kill: the first worker SIGKILLed right after a result's send intent), turned into a
reproduction by `session-store reproduce`, and re-run (service/reproduction.py) on a fresh
database. Prints one line per case and exits 1 if any re-run diverges.

    python bench/reproduce_all.py --db sqlite
    python bench/reproduce_all.py --db postgres
"""

from __future__ import annotations

import argparse
import asyncio
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
    out = root / f"{logged.call_id}.repro"
    args = ["--db", url] + (["--schema", schema] if schema else [])
    subprocess.run([sys.executable, "-m", "session_store.commands.cli", "reproduce", logged.call_id,
                    "--out", str(out), *args], check=True, capture_output=True)
    rerun_url, rerun_schema = await dbs()
    t0 = time.monotonic()
    result = await run_reproduction(out, rerun_url, schema=rerun_schema)
    verdict = "green" if result.divergence is None else "RED"
    print(f"{scenario:16} {label:10} kills {logged.kills}  events {len(result.actual):3}  "
          f"re-run {time.monotonic() - t0:5.1f} s  {verdict}", flush=True)
    if result.divergence is not None:
        print("    " + result.divergence.message().replace("\n", "\n    "), flush=True)
    return result.divergence is None


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--scenario", action="append", choices=sorted(SCRIPTED))
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="reproduce-all-") as tmp:
        dbs = Databases(args.db, Path(tmp))
        try:
            for scenario in args.scenario or SCRIPTED:
                for label in KILLS:
                    ok &= await one(scenario, label, dbs, Path(tmp))
        finally:
            await dbs.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
