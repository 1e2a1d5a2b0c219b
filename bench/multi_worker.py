"""Multi-worker on PostgreSQL: 4 worker processes share 400 calls; one dies, the others take over.

Each worker process owns a quarter of the calls: it opens them through `CallDriver.attach`
(SessionOpened, fencing epoch 1) and appends to each every 0.5-1.5 s (`CallDriver.record`;
the text names the worker and its epoch). Then:

1. kill: SIGKILL one worker. The supervisor sees the process exit and hands its calls to the
   three survivors round-robin; each takes a call over with `CallDriver.attach` (reads the
   log, appends WorkerAttached with epoch + 1) and keeps appending to it. Takeover time =
   SIGKILL to the moment the last WorkerAttached is durable (p50 over the calls as well).
   Detection here is the supervisor's wait on the child; a deployment that detects a dead
   worker by a lease adds the lease timeout to these figures.
2. zombie: SIGSTOP another worker (a frozen VM, a long GC pause: the process lives on), let
   the two others take its calls over, then SIGCONT it. Every append it then tries must be
   refused (Fenced), and none of its events may land after a takeover. A call whose head row
   the zombie held locked in an open transaction when it froze cannot be taken over until
   the zombie runs again (or PostgreSQL ends its session): those are counted.

Fencing check (both phases), on every taken-over call: versions are gap-free, the hash chain
verifies, the state's epoch is the new one, and after the WorkerAttached event every message
is the new owner's.

    python bench/multi_worker.py            # 4 workers, 400 calls
    python bench/multi_worker.py --quick    # CI: 4 workers, 100 calls, shorter phases
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from pathlib import Path


from callmix import (MODEL, PG_DSN, PG_URL, TOOLS, drop_schema, machine, ms,
                     pct, pg_reachable, pg_schema)
from service.driver import CallDriver
from session_store import load_state, open_store
from session_store.errors import Fenced
from session_store.events import ConversationMessage
from session_store.storage.migrate import upgrade
from session_store.audit.verify import verify_log

WORKERS = 4


# ------------------------------------------------------------------ worker process

async def worker_main(schema: str, name: str, calls: list[str]) -> None:
    store = await open_store(PG_URL, schema=schema, pool_size=4, writers=2)
    out = sys.stdout
    stopping = asyncio.Event()
    stats = {"appends": 0, "fenced": 0, "errors": 0}
    opened = [0]

    def say(**msg) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    async def run_call(call_id: str, takeover: bool) -> None:
        began = time.time()
        driver = CallDriver(store, call_id, worker_id=name)
        try:
            await driver.attach(model=MODEL, tools=TOOLS, settings={})
        except Exception as exc:  # noqa: BLE001 - reported to the supervisor
            stats["errors"] += 1
            say(error=f"attach {call_id}: {type(exc).__name__}: {exc}")
            return
        finally:
            opened[0] += not takeover
        if takeover:
            say(attached=call_id, epoch=driver.epoch, at=time.time(), took=time.time() - began)
        rng, i = random.Random(call_id + name), 0
        while not stopping.is_set():
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            i += 1
            try:
                await driver.record(ConversationMessage("assistant", f"{name}/e{driver.epoch} #{i}"))
                stats["appends"] += 1
            except Fenced:
                stats["fenced"] += 1
                say(fenced=call_id, at=time.time())
                return
            except Exception as exc:  # noqa: BLE001 - reported; the run counts it
                stats["errors"] += 1
                say(error=f"record {call_id}: {type(exc).__name__}: {exc}")
                return

    tasks = [asyncio.create_task(run_call(c, False)) for c in calls]
    while opened[0] < len(calls):  # ready once every initial call is open (durably)
        await asyncio.sleep(0.01)
    say(ready=name)
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        cmd = json.loads(line)
        if "takeover" in cmd:
            tasks += [asyncio.create_task(run_call(c, True)) for c in cmd["takeover"]]
        elif cmd.get("stop"):
            break
    stopping.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await store.close()
    say(done=name, **stats)


# ------------------------------------------------------------------ supervisor

class Worker:
    def __init__(self, name: str, proc: asyncio.subprocess.Process, attached: dict):
        self.name, self.proc, self.lines = name, proc, asyncio.Queue()
        self.attached = attached  # call id -> its takeover message, shared by all workers
        self.log: list[dict] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            self.log.append(msg)
            if "attached" in msg:
                self.attached[msg["attached"]] = msg
            await self.lines.put(msg)
        await self.lines.put(None)  # the process ended

    def send(self, **cmd) -> None:
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())

    async def expect(self, key: str, timeout: float) -> dict:
        while True:
            msg = await asyncio.wait_for(self.lines.get(), timeout)
            if msg is None:
                raise RuntimeError(f"worker {self.name} exited (code {await self.proc.wait()}) "
                                   f"before saying {key!r}; its stderr is above")
            if key in msg:
                return msg


async def spawn(schema: str, name: str, calls: list[str], attached: dict) -> Worker:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--worker", schema, name, ",".join(calls),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parent.parent))
    return Worker(name, proc, attached)


async def take_over(victim: list[str], heirs: list[Worker], t0: float, patience: float,
                    attached_log: dict) -> dict:
    """Hand `victim` calls to `heirs` round-robin; wait for their WorkerAttached events."""
    plan: dict[str, list[str]] = {w.name: [] for w in heirs}
    for i, call in enumerate(victim):
        plan[heirs[i % len(heirs)].name].append(call)
    sent = time.time()
    for w in heirs:
        w.send(takeover=plan[w.name])
        await w.proc.stdin.drain()
    owner = {c: n for n, cs in plan.items() for c in cs}
    deadline = time.monotonic() + patience
    while len([c for c in victim if c in attached_log]) < len(victim):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)
    done = [attached_log[c]["at"] - t0 for c in victim if c in attached_log]
    took = [attached_log[c]["took"] for c in victim if c in attached_log]
    return {"calls": len(victim), "attached_in_time": len(done), "handover_s": round(sent - t0, 3),
            "takeover_p50_ms": ms(pct(done, 50)), "takeover_max_ms": ms(max(done, default=0)),
            "attach_p50_ms": ms(pct(took, 50)), "owner": owner}


async def check_fencing(store, calls: list[str], owner: dict[str, str], old: str) -> dict:
    bad: list[str] = []
    for call in calls:
        records = await store.read(call)
        state = await load_state(store, call, use_snapshot=False)
        reports = await verify_log(store, call)
        attach = [r.version for r in records if r.type == "session.worker_attached"]
        after = [r.event.text for r in records if attach and r.version > attach[-1]
                 and r.type == "conversation.message"]
        problems = []
        if [r.version for r in records] != list(range(1, len(records) + 1)):
            problems.append("gap")
        if not all(rep.ok for rep in reports):
            problems.append("chain")
        if not attach or state.epoch != 2:
            problems.append(f"epoch {state.epoch}")
        if any(t.startswith(f"{old}/") for t in after):
            problems.append("old worker wrote after the takeover")
        if not all(t.startswith(f"{owner[call]}/e2 ") for t in after):
            problems.append("a message after the takeover is not the new owner's")
        if problems:
            bad.append(f"{call}: {', '.join(problems)}")
    return {"checked": len(calls), "violations": len(bad), "examples": bad[:5]}


async def supervise(calls_total: int, warm: float, settle: float) -> dict:
    schema = await pg_schema()
    workers: list[Worker] = []
    try:
        await upgrade(PG_URL, schema=schema)
        names = [f"w{i}" for i in range(WORKERS)]
        owned = {n: [f"call-{n}-{k:03d}" for k in range(calls_total // WORKERS)] for n in names}
        attached: dict[str, dict] = {}
        workers = [await spawn(schema, n, owned[n], attached) for n in names]
        for w in workers:
            await w.expect("ready", 120)
        await asyncio.sleep(warm)

        # Phase 1: SIGKILL w0; w1..w3 take over.
        dead = workers[0]
        t_kill = time.time()
        dead.proc.send_signal(signal.SIGKILL)
        await dead.proc.wait()
        detect = time.time() - t_kill
        kill = await take_over(owned[dead.name], workers[1:], t_kill, 30, attached)
        kill["detect_ms"] = round(detect * 1e3, 1)
        await asyncio.sleep(settle)

        # Phase 2: SIGSTOP w1 (a zombie); w2, w3 take over; SIGCONT w1.
        zombie = workers[1]
        t_stop = time.time()
        zombie.proc.send_signal(signal.SIGSTOP)
        zomb = await take_over(owned[zombie.name], workers[2:], t_stop, 5, attached)
        zombie.proc.send_signal(signal.SIGCONT)
        t_cont = time.time()
        while len([c for c in owned[zombie.name] if c in attached]) < len(owned[zombie.name]):
            if time.time() - t_cont > 30:
                break
            await asyncio.sleep(0.01)
        zomb["attached_after_sigcont"] = (len([c for c in owned[zombie.name] if c in attached])
                                          - zomb["attached_in_time"])
        await asyncio.sleep(settle)
        for w in workers[1:]:
            w.send(stop=True)
            await w.proc.stdin.drain()
        done = {w.name: await w.expect("done", 60) for w in workers[1:]}
        for w in workers[1:]:
            await w.proc.wait()
        zomb["zombie_fenced_calls"] = done[zombie.name]["fenced"]

        store = await open_store(PG_URL, schema=schema)
        try:
            kill["fencing"] = await check_fencing(store, owned[dead.name], kill.pop("owner"),
                                                  dead.name)
            zomb["fencing"] = await check_fencing(store, owned[zombie.name], zomb.pop("owner"),
                                                  zombie.name)
        finally:
            await store.close()
        errors = [m for w in workers for m in w.log if "error" in m]
        return {"workers": WORKERS, "calls": calls_total, "kill": kill, "zombie": zomb,
                "survivor_appends": sum(d["appends"] for n, d in done.items() if n != zombie.name),
                "errors": len(errors), "first_errors": [e["error"] for e in errors[:3]]}
    finally:
        for w in workers:
            if w.proc.returncode is None:
                w.proc.send_signal(signal.SIGCONT)
                w.proc.kill()
                await w.proc.wait()
        await drop_schema(schema)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 calls, shorter phases (CI)")
    args = parser.parse_args()
    if not await pg_reachable():
        print(f"PostgreSQL not reachable at {PG_DSN}: multi-worker benchmark skipped")
        return 0
    calls, warm, settle = (100, 2.0, 2.0) if args.quick else (400, 5.0, 4.0)
    r = await supervise(calls, warm, settle)
    k, z = r["kill"], r["zombie"]
    print(f"{machine()}; {WORKERS} workers, {calls} calls on PostgreSQL; {r['survivor_appends']} appends by "
          f"the survivors, {r['errors']} errors")
    print("takeover = signal to WorkerAttached durable, per call (p50, max); attach = one "
          "CallDriver.attach (load + append), p50; fenced = zombie calls refused after SIGCONT")
    print(f"{'phase':8} {'calls':>5} {'attached':>8} {'detect ms':>9} {'p50 ms':>8} "
          f"{'max ms':>8} {'attach ms':>9} {'fenced':>6} {'violations':>10}")
    print(f"{'SIGKILL':8} {k['calls']:>5} {k['attached_in_time']:>8} {k['detect_ms']:>9.1f} "
          f"{k['takeover_p50_ms']:>8.1f} {k['takeover_max_ms']:>8.1f} {k['attach_p50_ms']:>9.1f} "
          f"{'-':>6} {k['fencing']['violations']:>10}")
    print(f"{'SIGSTOP':8} {z['calls']:>5} {z['attached_in_time']:>8} {'-':>9} "
          f"{z['takeover_p50_ms']:>8.1f} {z['takeover_max_ms']:>8.1f} {z['attach_p50_ms']:>9.1f} "
          f"{z['zombie_fenced_calls']:>6} {z['fencing']['violations']:>10}")
    if z["attached_after_sigcont"]:
        print(f"  {z['attached_after_sigcont']} call(s) could not be taken over until the zombie "
              "ran again: it froze inside a transaction holding their head rows (FOR UPDATE)")
    held = (k["fencing"]["violations"] == 0 and z["fencing"]["violations"] == 0
            and k["attached_in_time"] == k["calls"])
    print(f"fencing held: {'YES' if held else 'NO'}; "
          f"takeover (SIGKILL to last WorkerAttached durable): {k['takeover_max_ms']:.0f} ms")
    for e in r["first_errors"]:
        print(f"  error: {e}")
    print(json.dumps({"bench": "multi_worker", "quick": args.quick, "fencing_held": held, **r}))
    return 0 if held and not r["errors"] else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        asyncio.run(worker_main(sys.argv[2], sys.argv[3], sys.argv[4].split(",")))
    else:
        sys.exit(asyncio.run(main()))
