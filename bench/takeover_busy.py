"""A takeover while the old worker appends as fast as it can: how long until the new worker
is attached (issue #27, item 1).

Each round opens a call in an old worker process (`CallDriver.attach`), which records
messages back to back (`CallDriver.record`, one in flight at a time) for a warm-up. Then:

- idle (the baseline, same run): the old worker stops appending, and a new `CallDriver`
  in this process attaches;
- busy: the old worker keeps appending at its full rate while the new one attaches.

Attach = `CallDriver.attach` returning (WorkerAttached durable, and every event the old
worker committed before it folded in), from the moment it is called. Also measured: the old
worker's append rate, how many of its events the takeover had to catch up on (committed
between the new worker's read and its WorkerAttached), and how long after the attach the old
worker heard it was fenced (its next append). Before `take_over`, an attach read the log and
appended at the version it read: the third mode ("before") does that, against the same busy
old worker, and counts the rounds it lost all 8 tries of (ConcurrencyConflict).

    python bench/takeover_busy.py            # 10 rounds per database and mode
    python bench/takeover_busy.py --quick    # 3 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path


from callmix import PG_URL, drop_schema, machine, ms, pct, pg_reachable, pg_schema
from service.driver import CallDriver
from session_store import load_state, open_store
from session_store.errors import ConcurrencyConflict, Fenced
from session_store.events import ConversationMessage, WorkerAttached
from session_store.storage.migrate import upgrade

WARM_UP = 300  # old appends before the takeover (the call then has ~300 events to load)
MODEL = dict(model="m", tools=[], settings={})


# ------------------------------------------------------------------ the old worker process

async def worker_main(url: str, schema: str, call_id: str, inline: str, mode: str) -> None:
    store = await open_store(url, **({"schema": schema} if schema else {"inline": inline}))
    out = sys.stdout

    def say(**msg) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    driver = CallDriver(store, call_id, worker_id="old")
    try:
        await driver.attach(**MODEL)
        n, began = 0, time.perf_counter()
        try:
            while n < WARM_UP or mode != "idle":
                await driver.record(ConversationMessage("user", f"old {n}", 1))
                n += 1
                if n == WARM_UP:
                    say(warm=n, per_s=n / (time.perf_counter() - began))
            # idle: wait for the takeover, then try once more
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            await driver.record(ConversationMessage("user", "old, after", 1))
            say(error="appended after the takeover")
        except Fenced:
            say(fenced=n, at=time.time())
    except Exception as exc:  # noqa: BLE001 - reported
        say(error=f"{type(exc).__name__}: {exc}")
    finally:
        await store.close()


# ------------------------------------------------------------------ the supervisor

async def attach_at_the_version_read(store, call_id: str) -> None:
    """The attach before `take_over`: read, append at that version, 8 tries."""
    for _ in range(8):
        state = await load_state(store, call_id)
        try:
            await store.append(call_id, [WorkerAttached("new", state.epoch + 1)], state.version,
                               epoch=state.epoch + 1)
            return
        except ConcurrencyConflict:
            await asyncio.sleep(0.01)
    raise ConcurrencyConflict(call_id, state.version, None)


async def one_round(url: str, schema: str, inline: str, mode: str, call_id: str) -> dict:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--worker", url, schema, call_id, inline, mode,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parent.parent))
    store = await open_store(url, **({"schema": schema} if schema else {}))
    try:
        async def line() -> dict:
            return json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))

        warm = await line()
        if "warm" not in warm:
            return {"error": warm}
        before = await store.stream_version(call_id)
        new = CallDriver(store, call_id, worker_id="new")
        began = time.perf_counter()
        try:
            if mode == "before":
                await attach_at_the_version_read(store, call_id)
            else:
                await new.attach(**MODEL)
        except Exception as exc:  # noqa: BLE001 - counted
            return {"failed": f"{type(exc).__name__}: {exc}", "per_s": warm["per_s"]}
        took = time.perf_counter() - began
        attached_at = time.time()
        if mode == "idle":
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        end = await line()
        if "fenced" not in end:
            return {"error": end}
        caught_up = (new.state.version if mode != "before" else
                     await store.stream_version(call_id)) - 1 - before
        return {"attach_s": took, "per_s": warm["per_s"], "caught_up": caught_up,
                "fenced_after_s": max(0.0, end["at"] - attached_at)}
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await store.close()


async def run_backend(name: str, url: str, schema: str, inline: str, rounds: int) -> dict:
    results: dict[str, list[dict]] = {"idle": [], "busy": [], "before": []}
    for i in range(rounds):
        for mode in results:  # interleaved: all see the same machine
            results[mode].append(await one_round(url, schema, inline, mode, f"{name}-{mode}-{i}"))
    return results


def row(name: str, results: dict) -> dict:
    out = {"backend": name}
    for mode, rs in results.items():
        good = [r for r in rs if "attach_s" in r]
        out[mode] = {"rounds": len(rs), "failed": sum("failed" in r for r in rs),
                     "errors": [r["error"] for r in rs if "error" in r][:3],
                     "old_per_s": round(pct([r["per_s"] for r in rs if "per_s" in r], 50)),
                     "attach_p50_ms": ms(pct([r["attach_s"] for r in good], 50)),
                     "attach_max_ms": ms(max((r["attach_s"] for r in good), default=0)),
                     "caught_up_p50": pct([r["caught_up"] for r in good], 50),
                     "caught_up_max": max((r["caught_up"] for r in good), default=0),
                     "fenced_after_max_ms": ms(max((r["fenced_after_s"] for r in good),
                                                   default=0))}
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds (CI)")
    args = parser.parse_args()
    rounds = 3 if args.quick else 10
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for inline in ("never", "always"):
            url = f"sqlite+aiosqlite:///{tmp}/takeover-{inline}.db"
            await upgrade(url)
            rows.append(row(f"sqlite (old: inline {inline})",
                            await run_backend(f"s{inline}", url, "", inline, rounds)))
    if await pg_reachable():
        schema = await pg_schema()
        try:
            await upgrade(PG_URL, schema=schema)
            rows.append(row("postgres", await run_backend("pg", PG_URL, schema, "never", rounds)))
        finally:
            await drop_schema(schema)
    else:
        print("PostgreSQL not reachable: its rows are skipped")
    print(f"{machine()}; {rounds} rounds per mode; the old worker made {WARM_UP} appends first")
    print("attach = CallDriver.attach called to returned (WorkerAttached durable, caught up); "
          "idle: the old worker stopped appending (baseline); busy: it appends back to back")
    print("caught up: old events folded in by the takeover; fenced in: from the attach's "
          "return to the old worker's refused append (0: before it returned); before: read, "
          "then append at that version (the attach until now): rounds that lost all 8 tries")
    print(f"{'backend':26} {'old/s':>6} {'idle p50/max ms':>16} {'busy p50/max ms':>16} "
          f"{'busy/idle p50':>13} {'caught up p50/max':>17} {'fenced in max ms':>16} "
          f"{'failed':>6} {'before: lost':>12}")
    ok = True
    for r in rows:
        idle, busy, before = r["idle"], r["busy"], r["before"]
        ratio = (busy["attach_p50_ms"] / idle["attach_p50_ms"]) if idle["attach_p50_ms"] else 0
        print(f"{r['backend']:26} {busy['old_per_s']:>6} "
              f"{idle['attach_p50_ms']:>7.1f}/{idle['attach_max_ms']:<8.1f} "
              f"{busy['attach_p50_ms']:>7.1f}/{busy['attach_max_ms']:<8.1f} {ratio:>12.2f}x "
              f"{busy['caught_up_p50']:>8}/{busy['caught_up_max']:<8} "
              f"{busy['fenced_after_max_ms']:>16.1f} {busy['failed'] + idle['failed']:>6} "
              f"{before['failed']:>7}/{before['rounds']:<4}")
        for e in busy["errors"] + idle["errors"] + before["errors"]:
            print(f"  error: {e}")
        ok = ok and not (busy["failed"] or idle["failed"] or busy["errors"] or idle["errors"])
    print(json.dumps({"bench": "takeover_busy", "quick": args.quick, "rows": rows}))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        asyncio.run(worker_main(*sys.argv[2:7]))
    else:
        sys.exit(asyncio.run(main()))
