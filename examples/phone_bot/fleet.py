"""The phone bot as a fleet: worker processes on one database, phone calls, one SIGKILL.

    python -m examples.phone_bot.fleet --db postgres --calls 20     # make demo-fleet
    python -m examples.phone_bot.fleet --db sqlite --calls 20       # workers on one host

Starts the local Gemini Live server (gemini_script.py plays Google), `--workers` uvicorn
processes of examples.phone_bot.server on one database, and `--calls` concurrent phone
calls through the telephony stand-in (telephony.py plays Twilio and the load balancer).
While a chosen call is at a random point of one of its tool calls, the worker serving it
is SIGKILLed. Every call it was serving must go on, through Twilio's redirect, on another
worker. The verdict is checked against three records that do not share code paths: the
local server's record (what Gemini received), the tools' ledger (their side effects) and
the log, plus the stand-in's recordings of what each caller heard:

- per call I1-I9 (rig.crash.invariants.check_call): every tool call answered exactly
  once, no tool ran twice unless idempotent (then with one key), fencing epochs, chains;
- the call was opened once and ended once, by the caller hanging up after the goodbye;
- a call of the killed worker continued on another worker (a new stream, a WorkerAttached
  by another process), the caller's audio reached Gemini again, and nothing of the killed
  worker was written after the takeover (no event after the WorkerAttached stamped before
  the kill, no tool run by its pid after the kill, no message on its Gemini connections
  after the takeover);
- per affected call: the audio gap (kill -> first bot audio on the new stream) and the
  takeover time (kill -> WorkerAttached durable), with p50/p99;
- per stall the callers heard (hearing.py), who made it (stall_sources): this process's
  loop (the rig: callers and Gemini stand-in) or the serving worker's, each sampled by
  loop_lag.py (the workers run the probed app), with the machine's load and each
  process's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import json
import math
import os
import random
import signal
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rig.crash.harness import PG_URL, Databases
from rig.crash.invariants import check_call
from rig.crash.scenarios import Scenario
from service.local_live import LocalLiveServer
from session_store import events as ev
from session_store import open_store
from session_store.audit.verify import verify_log

from . import fleet_metrics
from .gemini_script import (CATCH_UP_WAIT_S, TONES, PhoneCallPlan, caller_of, order_of,
                            tool_calls)
from .hearing import Hearing, Stall, hear, runs_of
from .loop_lag import LoopLag, blocked, worst
from .telephony import Balancer, PhoneCall, TwilioRestApi
from .tools import CHECKED, IDEMPOTENT

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_URL = "https://phone-bot.invalid"  # the load balancer's address (.invalid: never real)
ACCOUNT_SID = "AC" + "0" * 32  # (telephony.PhoneCall's)
CALL_LEASE_S = 3.0  # the workers' call leases (rescue.py): a lapsed one is swept this late
#: Where a kill can be placed (_plan_kill).
KILL_STEPS = ("greeting", "greeting-playing", "refund_order", "send_receipt", "farewell")
TOOL_EVENTS = ("tool.call_requested", "tool.call_started", "tool.call_completed",
               "tool.result_sending", "tool.result_sent")
HANG_UP_AFTER_QUIET_S = 0.8


@dataclass
class Worker:
    index: int
    port: int
    process: asyncio.subprocess.Process
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class Kill:
    call_sid: str
    tool: str
    after: str  # the tool's event the kill waited for
    delay_s: float
    worker: int = -1
    pid: int = -1
    at: float = 0.0  # time.time() right before the SIGKILL
    point: str = ""  # where the call really was, as its log says
    affected: list[str] = field(default_factory=list)  # CallSids with an open stream there
    over: bool = False  # done, or given up: the target's caller may hang up


@dataclass
class CallOutcome:
    call_sid: str
    caller: str
    workers: list[int]
    affected: bool
    problems: list[str]
    gap_s: float | None = None
    takeover_s: float | None = None
    opened_afresh: bool = False  # the dead worker had logged nothing of it: opened, not taken over
    redirect_s: float | None = None
    start_s: float | None = None  # first stream open -> session.opened (a new call's start)
    gap_parts: dict[str, float] | None = None  # the audio gap, step by step (GAP_PARTS)
    gemini_resumed: bool | None = None  # the new Gemini session resumed from a handle
    # It had nothing to answer (no seed, catch-up or result before its first audio): the
    # stand-in model spoke after waiting gemini_script.CATCH_UP_WAIT_S, for a caller who
    # says nothing (a real Gemini waits for the caller; `model` is that wait).
    unprompted: bool = False
    events: int = 0
    hearing: Hearing | None = None  # what the caller heard (hearing.py)


async def run_fleet(db: str = "sqlite", *, workers: int = 3, calls: int = 20, kill: bool = True,
                    seed: int | None = None, workdir: Path | None = None,
                    spread_s: float = 3.0, quiet: bool = False, keep: bool = False,
                    pg_url: str = PG_URL, kill_step: str | None = None,
                    kill_delay_s: float | None = None) -> dict:
    """`keep`: leave the database (the SQLite file in `workdir`, the PostgreSQL schema in
    `pg_url`'s database) for `session-store` to read afterwards; `summary["db_url"]` and
    `summary["db_schema"]` say where. `kill_step` (one of KILL_STEPS) and `kill_delay_s`: kill
    there instead of at a random step and delay (the call is still chosen by the seed)."""
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-")))
        workdir.mkdir(parents=True, exist_ok=True)
        databases = Databases(db, workdir, pg_url)
        url, schema = await databases()
        try:
            summary = await _run(url, schema, rng, say, workdir, workers, calls,
                                 (kill_step, kill_delay_s) if kill else None, spread_s, db)
            summary["seed"] = seed  # --seed repeats the same choice of call, tool and event
            summary["db_url"], summary["db_schema"] = url, schema
            (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
            return summary
        finally:
            if not keep:
                await databases.cleanup()


async def _run(url, schema, rng, say, workdir: Path, n_workers: int, n_calls: int,
               kill: tuple[str | None, float | None] | None, spread_s: float, db: str) -> dict:
    plan = PhoneCallPlan()
    ledger = workdir / "tool-ledger.jsonl"
    # The run's own: a kept workdir's ledger from the run before would read as tools run
    # twice (the calls' order ids repeat from run to run).
    ledger.unlink(missing_ok=True)
    token = uuid.uuid4().hex
    # Twilio's REST API too (the workers' documented rescue, rescue.py): it closes in the
    # log a call whose caller hung up as its worker died, before that worker logged the end.
    calls_by_sid: dict[str, PhoneCall] = {}
    async with LocalLiveServer(plan.script) as gemini, \
            TwilioRestApi(ACCOUNT_SID, token, calls_by_sid) as twilio_api:
        env = {**os.environ, "DATABASE_URL": url, "DATABASE_SCHEMA": schema or "",
               "PUBLIC_URL": PUBLIC_URL, "TWILIO_AUTH_TOKEN": token,
               "TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_API_BASE_URL": twilio_api.base_url,
               "CALL_LEASE_S": str(CALL_LEASE_S),
               "GEMINI_BASE_URL": gemini.base_url, "GEMINI_CA_CERT": str(gemini.cert_path),
               "TOOL_LEDGER": str(ledger), "LOGURU_LEVEL": "INFO",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        fleet = await _start_workers(n_workers, env, workdir)
        try:
            metrics_before = await fleet_metrics.scrape_all(fleet)
            say(f"{n_workers} workers ready ({db}): "
                + ", ".join(f"#{w.index} pid {w.pid} :{w.port}" for w in fleet))
            balancer = Balancer(PUBLIC_URL, [w.url for w in fleet])

            def hang_up_when(call: PhoneCall) -> bool:
                if kill_plan is not None and call is kill_plan[0] and not kill_plan[1].over:
                    return False  # the call to be killed in stays on the line until it is
                closing = plan.closing_sent.get(call.from_number)
                stream = call.streams[-1]
                # After the goodbye was heard (its tone: a worker running late still sends
                # the turn before it), and a quiet moment.
                return (closing is not None and bool(stream.media)
                        and stream.media[-1][0] > closing
                        and time.time() - stream.media[-1][0] > HANG_UP_AFTER_QUIET_S
                        and heard_goodbye(stream.audio, closing))

            phone_calls = [PhoneCall(balancer, f"{PUBLIC_URL}/twiml", f"+1555000{1000 + i}",
                                     hang_up_when=hang_up_when, auth_token=token)
                           for i in range(n_calls)]
            calls_by_sid.update({c.call_sid: c for c in phone_calls})
            kill_plan = _plan_kill(rng, phone_calls, *kill) if kill else None
            # This process's loop (the callers, the local Gemini server) is the rig: a late
            # wake-up of it stamps the audio late, which the ear hears as a stall.
            rig_lag = LoopLag()
            rig_lag.start()
            load = [os.getloadavg()[0]]
            cpu_before = _cpu_seconds(fleet)
            started = time.time()
            # The rig keeps every frame each caller heard and every message Gemini got: its
            # full collections grow to 60-140 ms of blocked loop, stamping audio late (a
            # stall the ear would put on the rig). A phone does not pause: none until the end.
            gc.disable()
            try:
                async with httpx.AsyncClient(timeout=10) as http:
                    async def place(i: int, call: PhoneCall) -> PhoneCall:
                        await asyncio.sleep(spread_s * i / max(1, n_calls))
                        return await call.run(http)

                    running = [asyncio.create_task(place(i, c)) for i, c in enumerate(phone_calls)]
                    killing = None
                    if kill_plan is not None:
                        killing = asyncio.create_task(_kill_mid_tool(
                            *kill_plan, phone_calls, fleet, url, schema, say))
                    await asyncio.gather(*running)
                    kill_record = await killing if killing else None
            finally:
                gc.enable()
            wall = time.time() - started
            cpu = {name: round((used - cpu_before.get(name, 0.0)) / wall, 2)
                   for name, used in _cpu_seconds(fleet).items()}
            load.append(os.getloadavg()[0])
            await rig_lag.stop()
            worker_lags = await _worker_loop_lags(fleet, started)
            say(f"{n_calls} calls done in {wall:.1f} s")
            await _await_ends(phone_calls, url, schema, say)
            _keep_audio(workdir, phone_calls)
            outcomes = await _judge(phone_calls, kill_record, fleet, gemini, plan, url, schema,
                                    ledger)
            _keep_sessions(workdir, gemini, phone_calls, kill_record)
            stalls = stall_sources(phone_calls, outcomes, rig_lag.samples, worker_lags)
            metrics = await fleet_metrics.collect(fleet, metrics_before, url, schema)
        finally:
            await _stop_workers(fleet)
    summary = _report(outcomes, kill_record, wall, db, n_workers, say)
    summary["stall_sources"] = _stall_summary(stalls, rig_lag.samples, worker_lags, load,
                                              fleet, say)
    # Cores used over the calls (1.0: one core): the rig's and each worker's (a killed
    # worker's up to the kill).
    summary["cpu"] = cpu
    say("CPU over the calls (cores): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
        + f"; the machine has {os.cpu_count()}")
    summary["metrics"] = metrics  # each worker's /metrics and what its log says they read
    return summary


# ------------------------------------------------------------------ workers

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _start_workers(n: int, env: dict, workdir: Path) -> list[Worker]:
    fleet = []
    for i in range(n):
        port = _free_port()
        log = workdir / f"worker-{i}.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "uvicorn", "examples.phone_bot.loop_lag:app",
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                cwd=ROOT, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT)
        fleet.append(Worker(i, port, process, log))
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            await asyncio.gather(*(_wait_ready(http, w) for w in fleet))
    except BaseException:
        await _stop_workers(fleet)
        raise
    return fleet


async def _wait_ready(http: httpx.AsyncClient, worker: Worker, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker.process.returncode is not None:
            raise RuntimeError(f"worker {worker.index} exited ({worker.process.returncode}): "
                               f"{worker.log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if (await http.get(f"{worker.url}/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"worker {worker.index} not ready after {timeout_s} s; log: {worker.log}")


async def _stop_workers(fleet: list[Worker]) -> None:
    for w in fleet:
        if w.process.returncode is None:
            w.process.send_signal(signal.SIGTERM)
    for w in fleet:
        try:
            await asyncio.wait_for(w.process.wait(), 15)
        except TimeoutError:
            w.process.kill()
            await w.process.wait()


def _cpu_seconds(fleet: list[Worker]) -> dict[str, float]:
    """CPU seconds used so far by this process (the rig) and each live worker (Linux)."""
    out = {"rig": _process_cpu(os.getpid())}
    for worker in fleet:
        with contextlib.suppress(OSError):
            out[f"worker {worker.index}"] = _process_cpu(worker.pid)
    return out


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _worker_loop_lags(fleet: list[Worker],
                            since: float) -> dict[str, list[tuple[float, float]]]:
    """Each live worker's late loop wake-ups since the calls began (loop_lag.probed; its
    startup, before it was ready, is not a call's); a killed worker's are gone with it."""
    lags = {}
    async with httpx.AsyncClient(timeout=30) as http:
        for worker in fleet:
            if worker.process.returncode is not None:
                continue
            answer = await http.get(f"{worker.url}/rig/loop-lag", params={"since": since})
            lags[worker.url] = [(at, late) for at, late in answer.json()["samples"]]
    return lags


# ------------------------------------------------------------------ the kill

def _plan_kill(rng, calls: list[PhoneCall], step: str | None = None,
               delay_s: float | None = None) -> tuple[PhoneCall, Kill]:
    """A random call and a random point of it: the greeting or the caller's request (0-2.2 s
    after it opened), one of its tools' events and 0-150 ms after it, or the goodbye (after
    the last result went to Gemini). `step` and `delay_s` fix the point instead (KILL_STEPS;
    "greeting-playing": after the greeting's message is logged, its audio still playing)."""
    target = rng.choice(calls)
    tools = [name for name, _ in tool_calls(target.from_number)]
    step = step or rng.choice(["greeting", *tools, "farewell"])

    def delay(low: float, high: float) -> float:
        return rng.uniform(low, high) if delay_s is None else delay_s

    if step == "greeting":
        return target, Kill(target.call_sid, "", "session.opened", delay(0.0, 2.2))
    if step == "greeting-playing":
        return target, Kill(target.call_sid, "", "conversation.message", delay(0.0, 1.2))
    if step == "farewell":
        return target, Kill(target.call_sid, tools[-1], "tool.result_sent", delay(0.1, 1.0))
    if step not in tools:
        raise ValueError(f"no step {step!r} in a phone call: {', '.join(KILL_STEPS)}")
    return target, Kill(target.call_sid, step, rng.choice(TOOL_EVENTS), delay(0.0, 0.15))


async def _kill_mid_tool(target: PhoneCall, kill: Kill, calls: list[PhoneCall],
                         fleet: list[Worker], url, schema, say) -> Kill:
    """SIGKILL the worker serving `target` once the log has the planned event of its tool,
    plus the planned delay: a random point of one of its tool calls."""
    tool, after = kill.tool, kill.after
    store = await open_store(url, **({"schema": schema} if schema else {}))
    try:
        seen: set[str] = set()
        version = 0
        while after not in seen:
            if target.status == "completed" or target.error:
                raise RuntimeError(f"the call to kill in ended first ({target.call_sid})")
            for record in await store.read(target.call_sid, from_version=version + 1):
                version = record.version
                if (record.type in (*TOOL_EVENTS, "session.opened", "conversation.message")
                    and record.data.get("call_id", "").startswith(tool)
                    and record.data.get("role", "assistant") == "assistant"):
                    seen.add(record.type)
            await asyncio.sleep(0.02)
        await asyncio.sleep(kill.delay_s)
        stream = target.streams[-1]
        victim = next(w for w in fleet if w.url == stream.worker)
        kill.worker, kill.pid = victim.index, victim.pid
        kill.affected = [c.call_sid for c in calls
                         if c.streams and c.streams[-1].worker == victim.url
                         and c.streams[-1].closed_at is None and c.status != "completed"]
        kill.at = time.time()
        victim.process.send_signal(signal.SIGKILL)
        records = await store.read(target.call_sid)
        mine = [r for r in records if r.recorded_at_us / 1e6 < kill.at
                and r.type in (TOOL_EVENTS if tool else (after,))
                and r.data.get("call_id", "").startswith(tool)]
        kill.point = (f"{tool or 'greeting'}: after {mine[-1].type}" if mine
                      else f"{tool}: before its request")
    finally:
        kill.over = True
        await store.close()
    say(f"SIGKILL worker #{kill.worker} (pid {kill.pid}) with {len(kill.affected)} calls on "
        f"it; target {kill.call_sid} at {kill.point} (+{kill.delay_s * 1000:.0f} ms)")
    return kill


# ------------------------------------------------------------------ the verdict

class _ServerView:
    """The local server's record restricted to one call's connections (check_call reads
    `connections`, `violations` and `errors`)."""

    def __init__(self, server: LocalLiveServer, caller: str):
        self.connections = [c for c in server.connections if caller_of(c) == caller]
        mine = {c.index for c in self.connections}
        self.violations = [v for v in server.violations if v["connection"] in mine]
        self.errors = [e for e in server.errors
                       if any(e.startswith(f"connection {i} ") or e.startswith(f"connection {i}:")
                              for i in mine)]


async def _await_ends(calls: list[PhoneCall], url, schema, say) -> None:
    """Wait (a lease and a sweep at most) for the log's end of every call the caller hung
    up: a worker logs it a moment after, or, if it died as the caller hung up, the sweep of
    a live one does once the dead one's lease lapsed (rescue.py)."""
    store = await open_store(url, **({"schema": schema} if schema else {}))
    deadline = time.monotonic() + 2 * CALL_LEASE_S
    try:
        while True:
            open_calls = [c.call_sid for c in calls if c.hung_up_at is not None
                          and not any(r.type == "session.closed"
                                      for r in await store.read(c.call_sid))]
            if not open_calls or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        if open_calls:
            say(f"still open in the log {2 * CALL_LEASE_S:g} s after the caller hung up: "
                f"{open_calls}")
    finally:
        await store.close()


async def _judge(calls, kill: Kill | None, fleet, gemini, plan, url, schema, ledger_path):
    entries = [json.loads(line) for line in ledger_path.read_text().splitlines()] \
        if ledger_path.exists() else []
    by_url = {w.url: w.index for w in fleet}
    outcomes = []
    store = await open_store(url, **({"schema": schema} if schema else {}))
    try:
        for call in calls:
            records = await store.read(call.call_sid)
            reports = await verify_log(store, call.call_sid)
            order = order_of(call.from_number)
            scenario = Scenario("phone_call", tool_calls(call.from_number),
                                idempotent=IDEMPOTENT, checked=CHECKED, rerun_if_not_done=True)
            mine = [e for e in entries if (e.get("args") or {}).get("order_id") == order]
            view = _ServerView(gemini, call.from_number)
            problems = check_call(scenario, records, reports, view, mine) if records else \
                ["the log has no event of this call"]
            problems += _check_phone_call(call, records, plan)
            heard = hear([s.audio for s in call.streams], TONES, plan.lengths())
            problems += [f"repeated utterance: {r}" for r in heard.repeats]
            # The ear's own check: a call that ended heard its greeting. (Its goodbye may be
            # missing: a worker killed while the goodbye played leaves a log saying it was
            # said, and the next one asks "anything else?". Counted, not yet fixed.)
            if "greeting" not in heard.heard_s and call.hung_up_at is not None:
                problems.append("the caller's audio holds no greeting tone")
            outcome = CallOutcome(call.call_sid, call.from_number,
                                  [by_url.get(s.worker, -1) for s in call.streams],
                                  bool(kill and call.call_sid in kill.affected), problems,
                                  events=len(records), hearing=heard)
            # The baseline: how long a new call takes from its stream to its log, same run.
            opened = next((r.recorded_at_us / 1e6 for r in records
                           if r.type == "session.opened"), None)
            reopened = outcome.affected and opened is not None and opened >= kill.at
            if opened is not None and call.streams and not reopened:
                outcome.start_s = opened - call.streams[0].opened_at
            if outcome.affected:
                _check_takeover(outcome, call, kill, fleet, records, view, mine)
            elif len(call.streams) != 1:
                problems.append(f"{len(call.streams)} streams, but its worker was not killed")
            outcomes.append(outcome)
    finally:
        await store.close()
    if plan.unknown_callers:
        outcomes[0].problems.append(f"the local server saw connections of no known caller: "
                                    f"{plan.unknown_callers}")
    return outcomes


def _check_phone_call(call: PhoneCall, records, plan) -> list[str]:
    out = []
    if call.error:
        out.append(f"telephony: {call.error}")
    if call.hung_up_at is None:
        out.append("the caller never hung up (no goodbye heard)")
    if any(w.status != 200 for w in call.webhooks):
        out.append(f"webhook answers {[w.status for w in call.webhooks]}")
    opened = sum(r.type == "session.opened" for r in records)
    closed = [r.data.get("reason") for r in records if r.type == "session.closed"]
    if opened != 1:
        out.append(f"the call was opened {opened} times")
    if closed != ["ended"]:
        out.append(f"the call was closed {closed} (once, 'ended', expected)")
    last = call.streams[-1] if call.streams else None
    closing = plan.closing_sent.get(call.from_number)
    if last is None or closing is None or not any(at > closing for at, _ in last.media):
        out.append("the goodbye never reached the caller on the last stream")
    return out


def _check_takeover(outcome: CallOutcome, call: PhoneCall, kill: Kill, fleet, records,
                    view: _ServerView, ledger: list[dict]) -> None:
    problems = outcome.problems
    victim_url = fleet[kill.worker].url
    before = [s for s in call.streams if s.opened_at < kill.at]
    after = [s for s in call.streams if s.opened_at >= kill.at]
    if before and before[-1].worker == victim_url and before[-1].ended_by == "caller":
        # They hung up as the worker died: the call is over, nothing goes on (the log's end
        # is checked with the others': a live worker's sweep closes it, rescue.py).
        outcome.affected = False
        return
    if not before or before[-1].worker != victim_url or before[-1].ended_by != "bot":
        problems.append("its stream on the killed worker did not end with the kill")
    if not after:
        problems.append("no new stream after the kill: the call did not continue")
        return
    if any(s.worker == victim_url for s in after):
        problems.append("a stream after the kill went to the killed worker")
    # A call the killed worker had logged nothing of yet is opened afresh by the next one.
    logged = any(r.recorded_at_us / 1e6 < kill.at for r in records)
    kind = "session.worker_attached" if logged else "session.opened"
    outcome.opened_afresh = not logged
    attached = [r for r in records if r.type == kind and r.recorded_at_us / 1e6 >= kill.at]
    if not attached:
        problems.append(f"no worker took the call over in the log (no {kind} after the kill)")
        return
    takeover = attached[0]
    if f":{kill.pid}:" in takeover.data.get("worker", ""):
        problems.append("the call was taken over by the killed process")
    # Fencing, against the three records: nothing of the killed worker after the takeover.
    kill_us = int(kill.at * 1e6)
    late = [r for r in records if r.version > takeover.version and r.recorded_at_us < kill_us]
    problems += [f"I6: v{r.version} {r.type} was stamped before the kill but lies after the "
                 f"takeover (written by the killed worker)" for r in late]
    problems += [f"I6: the killed worker ran {e['tool']} after the kill"
                 for e in ledger if e.get("pid") == kill.pid and e.get("at", 0) >= kill.at]
    attach_at = takeover.recorded_at_us / 1e6
    for conn in view.connections:
        if conn.opened_at < kill.at:
            late_msgs = [m for m in conn.received if m.at > attach_at]
            if late_msgs:
                problems.append(f"I6: Gemini connection {conn.index} (opened before the kill) "
                                f"received {len(late_msgs)} messages after the takeover")
    if not any(c.opened_at >= kill.at and c.messages("realtime_input") for c in view.connections):
        problems.append("the caller's audio never reached Gemini after the takeover")
    first_audio = after[0].first_audio_at
    if first_audio is None:
        problems.append("the caller heard nothing on the new stream")
    else:
        outcome.gap_s = first_audio - kill.at
    outcome.takeover_s = attach_at - kill.at
    outcome.redirect_s = after[0].opened_at - kill.at
    conn = next((c for c in view.connections if c.opened_at >= attach_at), None)
    if first_audio is not None and conn is not None:
        outcome.gap_parts, outcome.unprompted = gap_parts(kill.at, before[-1], call.webhooks,
                                                          after[0], attach_at, conn)
        outcome.gemini_resumed = conn.resumed_from is not None


#: The audio gap's steps, in order: each is the time from the previous one's end.
GAP_PARTS = {
    "closed": "kill -> the caller's side sees the stream close",
    "webhook": "-> the redirect's webhook answered (TwiML)",
    "stream": "-> the new stream open",
    "attach": "-> session.worker_attached (takeover, new epoch)",
    "connect": "-> the Gemini websocket open",
    "setup": "-> setupComplete",
    "input": "-> the session's first input (seed, catch-up or tool result)",
    "model": "-> the model's first audio",
    "delivery": "-> the first audio at the caller",
}


def gap_parts(killed_at: float, old, webhooks, new, attached_at: float,
              conn) -> tuple[dict, bool]:
    """One moved call's audio gap cut at the timestamps of the stand-in (stream closed,
    webhook, new stream, first audio), the log (worker_attached) and the local server
    (connection, setupComplete, first input, first audio); and whether the model spoke
    before any input came (`input` is then 0: a resumed session that lacked nothing waits
    gemini_script.CATCH_UP_WAIT_S for input first, and that wait is in `model`)."""
    hook = next((w for w in webhooks if w.asked_at >= (old.closed_at or killed_at)), None)
    setup_at = next((m.at for m in conn.sent if isinstance(m.message, dict)
                     and "setupComplete" in m.message), conn.opened_at)
    audio_at = next((m.at for m in conn.sent if _is_audio(m.message)), None)
    input_at = next((m.at for m in conn.received if m.kind in ("client_content", "tool_response")
                     and m.at >= setup_at), None)
    unprompted = audio_at is not None and (input_at is None or input_at > audio_at)
    if unprompted:
        input_at = setup_at
    marks = [killed_at, old.closed_at, hook.at if hook else None, new.opened_at, attached_at,
             conn.opened_at, setup_at, input_at, audio_at, new.first_audio_at]
    parts = {}
    for name, start, end in zip(GAP_PARTS, marks, marks[1:]):
        if start is None or end is None:
            return {}, unprompted
        parts[name] = end - start
    return parts, unprompted


def _is_audio(message) -> bool:
    content = message.get("serverContent") if isinstance(message, dict) else None
    turn = content.get("modelTurn") if isinstance(content, dict) else None
    return isinstance(turn, dict) and any("inlineData" in part
                                          for part in turn.get("parts") or [])


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest rank (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def _report(outcomes: list[CallOutcome], kill: Kill | None, wall: float, db: str,
            workers: int, say) -> dict:
    gaps = [o.gap_s for o in outcomes if o.gap_s is not None]
    takeovers = [o.takeover_s for o in outcomes if o.takeover_s is not None]
    attaches = [o.takeover_s - o.redirect_s for o in outcomes
                if o.takeover_s is not None and o.redirect_s is not None]
    starts = [o.start_s for o in outcomes if o.start_s is not None]
    violations = [f"{o.call_sid} ({o.caller}): {p}" for o in outcomes for p in o.problems]
    # Whole call ids: each is what `session-store timeline CALL` takes.
    width = max([len(o.call_sid) for o in outcomes] + [4])
    say(f"{'call':{width}} {'caller':13} {'workers':9} {'events':>6} {'redirect':>9} "
        f"{'takeover':>9} {'audio gap':>9}")
    for o in outcomes:
        if o.affected or o.problems:
            say(f"{o.call_sid:{width}} {o.caller:13} {'->'.join(map(str, o.workers)):9} "
                f"{o.events:>6} {_s(o.redirect_s):>9} {_s(o.takeover_s):>9} {_s(o.gap_s):>9}"
                + ("  <- target" if kill and o.call_sid == kill.call_sid else ""))
    summary = {
        "db": db, "workers": workers, "calls": len(outcomes), "wall_s": round(wall, 1),
        "killed": None if kill is None else {
            "worker": kill.worker, "pid": kill.pid, "target": kill.call_sid,
            "point": kill.point, "delay_ms": round(kill.delay_s * 1000),
            "calls_on_it": len(kill.affected)},
        "affected": [o.call_sid for o in outcomes if o.affected],
        "opened_afresh": [o.call_sid for o in outcomes if o.affected and o.opened_afresh],
        "audio_gap_s": {"p50": _round(_percentile(gaps, 50)), "p99": _round(_percentile(gaps, 99)),
                        "per_call": [_round(g) for g in gaps]},
        "takeover_s": {"p50": _round(_percentile(takeovers, 50)),
                       "p99": _round(_percentile(takeovers, 99)),
                       "per_call": [_round(t) for t in takeovers]},
        # From the new stream to the log: the takeover's own part, against a new call's.
        "takeover_after_stream_s": {"p50": _round(_percentile(attaches, 50)),
                                    "p99": _round(_percentile(attaches, 99))},
        "new_call_start_s": {"p50": _round(_percentile(starts, 50)),
                             "p99": _round(_percentile(starts, 99))},
        # The audio gap step by step (GAP_PARTS): where the time goes, robust to load.
        "gap_parts_s": _gap_parts_summary(outcomes),
        # From the callers' audio: utterances heard whole and then again (violations),
        # cut ones said again from the top, silences inside an utterance over 100 ms.
        "heard": _heard_summary(outcomes),
        "violations": violations,
        "ok": not violations and (kill is None or bool(gaps)),
    }
    say(f"audio gap (kill -> first bot audio on the new stream): p50 "
        f"{_s(summary['audio_gap_s']['p50'])}, p99 {_s(summary['audio_gap_s']['p99'])}; "
        f"takeover (kill -> WorkerAttached): p50 {_s(summary['takeover_s']['p50'])}, p99 "
        f"{_s(summary['takeover_s']['p99'])}")
    say(f"from the new stream to WorkerAttached: p50 "
        f"{_s(summary['takeover_after_stream_s']['p50'])}, p99 "
        f"{_s(summary['takeover_after_stream_s']['p99'])}; a new call from its stream to "
        f"session.opened (same run): p50 {_s(summary['new_call_start_s']['p50'])}, p99 "
        f"{_s(summary['new_call_start_s']['p99'])}")
    parts = summary["gap_parts_s"]
    if parts["calls"]:
        say(f"the audio gap step by step ({parts['calls']} moved calls, "
            f"{parts['resumed']} resumed from a handle), p50 / p99:")
        for name, what in GAP_PARTS.items():
            say(f"  {name:9} {_s(parts[name]['p50']):>7} / {_s(parts[name]['p99']):>7}  {what}")
        say(f"  {parts['unprompted']} of them had nothing to answer: the stand-in model spoke "
            f"after waiting {CATCH_UP_WAIT_S:g} s for a caller who says nothing (in `model`); "
            f"the audio gap without that wait: p50 {_s(parts['gap_without_wait_s']['p50'])}, "
            f"p99 {_s(parts['gap_without_wait_s']['p99'])}; where the model had something "
            f"to answer: p50 {_s(parts['gap_prompted_s']['p50'])}, p99 "
            f"{_s(parts['gap_prompted_s']['p99'])}")
    heard = summary["heard"]
    say(f"heard by the callers: {heard['repeats']} repeated utterances "
        f"({heard['moved_calls']} moved calls), {heard['restarts']} cut utterances said "
        f"again, {heard['unfinished']} cut off and never heard whole, "
        f"{heard['goodbye_unheard']} calls ended without the goodbye heard, "
        f"{len(heard['stalls_s'])} stalls over 100 ms inside an utterance"
        + (f" (max {max(heard['stalls_s']):.3f} s)" if heard["stalls_s"] else ""))
    if violations:
        say(f"verdict: FAILED ({len(violations)})")
        for v in violations:
            say(f"  - {v}")
    else:
        say("verdict: OK - every call answered and ended once, no tool ran twice unless "
            "idempotent, every call of the killed worker went on on another, fencing held")
    return summary


def _gap_parts_summary(outcomes: list[CallOutcome]) -> dict:
    cut = [o for o in outcomes if o.gap_parts]
    summary: dict = {"calls": len(cut), "resumed": sum(bool(o.gemini_resumed) for o in cut),
                     "unprompted": sum(o.unprompted for o in cut)}
    for name in GAP_PARTS:
        values = [o.gap_parts[name] for o in cut]
        summary[name] = {"p50": _round(_percentile(values, 50)),
                         "p99": _round(_percentile(values, 99))}
    # The gap where the model had something to say at once, and every gap with the
    # stand-in's wait for a silent caller taken out (the part that is the fleet's own).
    spoke = [o.gap_s for o in cut if not o.unprompted and o.gap_s is not None]
    without = [o.gap_s - (o.gap_parts["model"] if o.unprompted else 0.0)
               for o in cut if o.gap_s is not None]
    for key, values in (("gap_prompted_s", spoke), ("gap_without_wait_s", without)):
        summary[key] = {"p50": _round(_percentile(values, 50)),
                        "p99": _round(_percentile(values, 99))}
    summary["per_call"] = {o.call_sid: {"resumed": o.gemini_resumed,
                                        "unprompted": o.unprompted,
                                        **{k: _round(v) for k, v in o.gap_parts.items()}}
                           for o in cut}
    return summary


def _heard_summary(outcomes: list[CallOutcome]) -> dict:
    heard = [o.hearing for o in outcomes if o.hearing is not None]
    moved = [o.hearing for o in outcomes if o.affected and o.hearing is not None]
    return {"repeats": sum(len(h.repeats) for h in heard),
            "moved_calls": len(moved),
            "repeats_in_moved_calls": sum(len(h.repeats) for h in moved),
            "restarts": sum(len(h.restarts) for h in heard),
            "restart_detail": [r for h in heard for r in h.restarts],
            "unfinished": sum(len(h.unfinished) for h in heard),
            "unfinished_detail": {o.call_sid: o.hearing.unfinished for o in outcomes
                                  if o.hearing is not None and o.hearing.unfinished},
            "goodbye_unheard": sum(1 for h in heard if "farewell" not in h.heard_s),
            "stalls_s": [s.seconds for h in heard for s in h.stalls],
            # What the caller of each moved or failed call heard, in order (utterance,
            # stream, seconds).
            "per_call": {o.call_sid: [(r.utterance, r.stream, round(r.seconds, 2))
                                      for r in o.hearing.runs]
                         for o in outcomes if (o.affected or o.problems)
                         and o.hearing is not None}}


#: How far back a worker's loop blocking can still be behind a stall: pipecat's transport
#: paces its writes in real time and never catches up a write it made late, so blocks
#: anywhere in the stretch before add up (the longest utterance lasts 1.2 s).
WORKER_LOOKBACK_S = 1.2
SOURCE_SLACK_S = 0.01  # two probe ticks: what the samples cannot resolve


def stall_sources(calls: list[PhoneCall], outcomes: list[CallOutcome],
                  rig: list[tuple[float, float]],
                  workers: dict[str, list[tuple[float, float]]]) -> list[dict]:
    """Each stall the ear heard, with who could have made it:

    - `quiet`: audio kept arriving but held no tone (the ear's or the script's doing);
    - `rig`: the phone ran dry, and this process's loop (the callers' stamps, the local
      Gemini server) was blocked for as long as the audio came late: the audio may have
      been there all along, read late;
    - `worker`: the loop of the worker serving the stream was blocked, in the stretch
      before, for as long as the audio came late (its writes fell behind);
    - `both`: each explains part, together all; `unexplained`: neither does (counted
      with the product's: the worker held the audio without its loop being blocked);
      `killed worker`: not the rig, on the stream of the worker killed (its probe died)."""
    by_sid = {c.call_sid: c for c in calls}
    out = []
    for outcome in outcomes:
        if outcome.hearing is None:
            continue
        for stall in outcome.hearing.stalls:
            stream = by_sid[outcome.call_sid].streams[stall.stream]
            row = {"call": outcome.call_sid, "utterance": stall.utterance,
                   "stream": stall.stream, "silence_s": stall.seconds,
                   "late_s": round(stall.late_s, 3), "at": round(stall.silent_from, 3)}
            worker_samples = workers.get(stream.worker)
            if not stall.dry:
                row["source"] = "quiet"
                out.append(row)
                continue
            rig_s = blocked(rig, stall.silent_from, stall.arrived_at)
            row["rig_blocked_s"] = round(rig_s, 3)
            row["rig_worst_s"] = round(worst(rig, stall.silent_from, stall.arrived_at), 3)
            need = stall.late_s - SOURCE_SLACK_S
            if worker_samples is None:  # the killed worker: its probe died with it
                worker_s = None
            else:
                since = stall.silent_from - WORKER_LOOKBACK_S
                worker_s = blocked(worker_samples, since, stall.arrived_at)
                row["worker_blocked_s"] = round(worker_s, 3)
                row["worker_worst_s"] = round(worst(worker_samples, since, stall.arrived_at), 3)
            if rig_s >= need:
                row["source"] = "rig"
            elif worker_s is None:
                row["source"] = "killed worker"
            elif worker_s >= need:
                row["source"] = "worker"
            elif rig_s + worker_s >= need:
                row["source"] = "both"
            else:
                row["source"] = "unexplained"
            out.append(row)
    return out


def _stall_summary(stalls: list[dict], rig: list[tuple[float, float]],
                   workers: dict[str, list[tuple[float, float]]], load: list[float],
                   fleet: list[Worker], say) -> dict:
    counts: dict[str, int] = {}
    for row in stalls:
        counts[row["source"]] = counts.get(row["source"], 0) + 1
    index = {w.url: w.index for w in fleet}
    summary: dict = {"counts": counts, "load": [round(x, 2) for x in load],
               "rig_loop": _lag_figures(rig),
               "worker_loops": {str(index[url]): _lag_figures(samples)
                                for url, samples in workers.items()},
               "per_stall": stalls}
    say(f"the stalls by source: {counts or 'none'} (load {load[0]:.1f} -> {load[-1]:.1f}); "
        f"loops blocked over 50 ms: the rig {summary['rig_loop']['over_50ms']} times (max "
        f"{summary['rig_loop']['max_ms']} ms), the workers "
        + ", ".join(f"#{i} {f['over_50ms']} (max {f['max_ms']} ms)"
                    for i, f in summary["worker_loops"].items()))
    for row in stalls:
        say(f"  {row['source']:11} {row['call']} {row['utterance']:12} silence "
            f"{row['silence_s']:.3f} s, audio {row['late_s'] * 1e3:.0f} ms late; blocked: rig "
            f"{_ms(row.get('rig_blocked_s'))}, worker {_ms(row.get('worker_blocked_s'))}")
    return summary


def _lag_figures(samples: list[tuple[float, float]]) -> dict:
    lates = [late for _, late in samples]
    return {"over_20ms": sum(x > 0.02 for x in lates), "over_50ms": sum(x > 0.05 for x in lates),
            "max_ms": round(max(lates, default=0.0) * 1e3, 1),
            # (when each of those ended, Unix seconds: to line them up with the kill, the
            # takeovers and the stalls)
            "over_50ms_at": [[round(at, 3), round(late * 1e3, 1)] for at, late in samples
                             if late > 0.05]}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"


def _keep_audio(workdir: Path, calls: list[PhoneCall]) -> None:
    """What each caller received, for a post-mortem of the ear's verdict: one JSON line per
    payload (call, stream, arrival time, base64 μ-law)."""
    with (workdir / "caller-audio.jsonl").open("w") as out:
        for call in calls:
            for index, stream in enumerate(call.streams):
                for at, payload in stream.audio:
                    out.write(json.dumps({"call": call.call_sid, "stream": index, "at": at,
                                          "ulaw": base64.b64encode(payload).decode()}) + "\n")


def _keep_sessions(workdir: Path, gemini: LocalLiveServer, calls: list[PhoneCall],
                   kill: Kill | None) -> None:
    """The Gemini sessions of each moved call, message by message without the caller's
    audio (time, direction, kind), for a post-mortem of its audio gap."""
    if kill is None:
        return
    moved = {c.from_number: c.call_sid for c in calls if c.call_sid in kill.affected}
    sessions = []
    for conn in gemini.connections:
        if caller_of(conn) not in moved:
            continue
        messages = [(m.at, "in", m.kind, m.body if m.kind in ("client_content", "tool_response")
                     else None) for m in conn.received if m.kind != "realtime_input"]
        messages += [(m.at, "out", next(iter(m.message)) if isinstance(m.message, dict)
                      else "raw", None if _is_audio(m.message) else m.message)
                     for m in conn.sent]
        sessions.append({"call": moved[caller_of(conn)], "connection": conn.index,
                         "opened_at": conn.opened_at, "resumed_from": conn.resumed_from,
                         "messages": sorted(messages, key=lambda m: m[0])})
    (workdir / "moved-sessions.json").write_text(json.dumps(
        {"killed_at": kill.at, "sessions": sessions}, indent=1, default=str))


def heard_goodbye(audio: list[tuple[float, bytes]], since: float) -> bool:
    """Does the audio received after `since` hold a closing utterance's tone?"""
    tail = [(at, payload) for at, payload in audio if at > since]
    goodbye = {k: TONES[k] for k in ("farewell", "still_there")}
    return any(r.utterance in goodbye for r in runs_of([tail], goodbye))


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="postgres")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--no-kill", action="store_true")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--kill-step", choices=KILL_STEPS,
                        help="kill there (default: a step the seed picks)")
    parser.add_argument("--kill-delay", type=float, metavar="S",
                        help="this long after the step's event (default: the seed picks)")
    parser.add_argument("--workdir", default="demo-fleet",
                        help="the SQLite database, ledger and worker logs (default ./demo-fleet)")
    parser.add_argument("--pg-url", default=os.environ.get("DEMO_FLEET_PG_URL", PG_URL),
                        help="with --db postgres: the database to write into, in a schema of "
                        "its own (default $DEMO_FLEET_PG_URL, else the local 'test' database)")
    parser.add_argument("--clean", action="store_true",
                        help="delete the database afterwards (kept by default, to look at)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    summary = asyncio.run(run_fleet(args.db, workers=args.workers, calls=args.calls,
                                    kill=not args.no_kill, seed=args.seed,
                                    workdir=Path(args.workdir), quiet=args.json,
                                    keep=not args.clean, pg_url=args.pg_url,
                                    kill_step=args.kill_step, kill_delay_s=args.kill_delay))
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not args.clean:
        where = summary["db_url"] + (f" --schema {summary['db_schema']}"
                                     if summary["db_schema"] else "")
        print(f"the calls are kept: session-store calls --db {where}")
        target = (summary.get("killed") or {}).get("target")
        if target:
            print(f"  the killed worker's call: session-store timeline {target} --db {where}")
        print(f"  in a browser: session-store serve --db {where}")
    raise SystemExit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
