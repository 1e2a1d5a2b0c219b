"""A call starting must not stall the other calls on its worker (issue #32, item 5).

One phone bot worker (examples.phone_bot.server under uvicorn, in a process of its own) with
1, then 10, then 20 live calls whose bot speaks without a pause; every 2 s a call starts on
it, alternately a new call and a takeover (the previous new call's stream drops without a
`stop`, as when its worker dies, and the call comes back on a new stream with its CallSid).
Per start, over its 2 s: the worker's largest event-loop lag (a 5 ms timer in the worker)
and the longest silence the other callers heard (their audio running out, played in real
time as Twilio does). Twice in the same run, on the same worker code:

- ours:  the phone bot as shipped (one process-wide TLS context, no smart-turn model);
- stock: the same bot with pipecat's and google-genai's defaults (a smart-turn ONNX model
         per call, a CA bundle parsed into each client's TLS contexts).

The local Gemini Live server runs in its own process, and both variants trust it through
SSL_CERT_FILE (certifi's bundle plus its certificate), so a TLS context costs what it costs
against Google. The callers (examples/phone_bot/telephony.py) run in this process; its own
loop lag is printed, as the floor of the silences measured.

    python bench/call_start.py             # 10 starts per size, SQLite
    python bench/call_start.py --quick     # 4 starts per size (CI)
    python bench/call_start.py --db postgres
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = (1, 10, 20)
EVERY_S = 2.0
LAG_TICK_S = 0.005
PUBLIC_URL = "https://phone-bot.invalid"


# ------------------------------------------------------------------ the worker process

def worker_main(variant: str, port: int) -> None:
    """The phone bot's app as shipped, or with pipecat's defaults (`stock`), with the
    loop-lag probe of examples/phone_bot/loop_lag.py (GET /rig/loop-lag)."""
    import uvicorn
    from google.genai import types

    import examples.phone_bot.bot as bot
    import examples.phone_bot.config as config
    import service.gemini_live as gemini_live
    from examples.phone_bot.loop_lag import probed
    from examples.phone_bot.server import app

    # Both variants: the server's certificate comes from SSL_CERT_FILE, like Google's CA.
    config._http_options = lambda base_url, cert_path: types.HttpOptions(base_url=base_url)
    if variant == "stock":
        gemini_live.with_shared_tls = lambda options: options
        bot.user_params = lambda *_args, **_kwargs: None  # pipecat's default user-turn strategies
        bot.WORKER_OPTIONS = {}  # pipecat's default observers (RTVI, turn tracking)
    uvicorn.run(probed(app), host="127.0.0.1", port=port, log_level="warning", lifespan="on")


# ------------------------------------------------------------------ the bench

@dataclass
class Start:
    kind: str  # "new" | "takeover"
    at: float
    lag_ms: float = 0.0
    gap_ms: float = 0.0
    first_audio_s: float | None = None  # its own first bot audio, from the webhook


@dataclass
class Level:
    variant: str
    live: int
    quiet_lag_ms: float = 0.0
    quiet_gap_ms: float = 0.0
    load: float = 0.0
    quiet_cpu: float = 0.0  # the worker's CPU use without starts (1.0: one core)
    # In the same window: the callers (this process) and the local Gemini server, and the
    # whole machine's busy share of all its cores: whether the worker had a core to itself.
    callers_cpu: float = 0.0
    model_cpu: float = 0.0
    machine_busy: float = 0.0
    starts: list[Start] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of every core since boot (Linux /proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


def heard_gaps(media: list[tuple[float, int]], since: float, until: float) -> float:
    """The longest silence a caller heard in [since, until): audio is played in real time
    from when it arrives (8000 bytes of μ-law a second); silence is its running out before
    the next message arrives, or before `until` (the bot of these calls never pauses)."""
    playing_until, longest = 0.0, 0.0
    for at, size in media:
        if at >= until:
            break
        if playing_until and at >= since:
            longest = max(longest, at - max(playing_until, since))
        playing_until = max(playing_until, at) + size / 8000
    if playing_until:
        longest = max(longest, until - max(playing_until, since))
    return longest


class Bench:
    def __init__(self, db_url: str, schema: str | None, workdir: Path, gemini: dict,
                 gemini_pid: int):
        self.db_url, self.schema, self.workdir, self.gemini = db_url, schema, workdir, gemini
        self.gemini_pid = gemini_pid
        self.bundle = workdir / "ca-bundle.pem"
        import certifi
        self.bundle.write_text(Path(certifi.where()).read_text()
                               + Path(gemini["cert_path"]).read_text())

    @contextlib.asynccontextmanager
    async def worker(self, variant: str):
        port = _free_port()
        env = {**os.environ, "DATABASE_URL": self.db_url, "DATABASE_SCHEMA": self.schema or "",
               "PUBLIC_URL": PUBLIC_URL, "GEMINI_BASE_URL": self.gemini["base_url"],
               "GEMINI_CA_CERT": self.gemini["cert_path"], "SSL_CERT_FILE": str(self.bundle),
               "TOOL_LEDGER": str(self.workdir / "ledger.jsonl"), "LOGURU_LEVEL": "WARNING",
               "PYTHONPATH": str(ROOT)}
        log = (self.workdir / f"worker-{variant}.log").open("wb")
        process = subprocess.Popen([sys.executable, __file__, "--worker", variant, str(port)],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        import httpx
        try:
            async with httpx.AsyncClient(timeout=60) as http:  # a starved worker answers late
                for _ in range(600):
                    if process.poll() is not None:
                        raise RuntimeError(f"worker {variant} exited: see {log.name}")
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{url}/readyz")).status_code == 200:
                            break
                    await asyncio.sleep(0.1)
                else:
                    raise TimeoutError(f"worker {variant} not ready")
                yield url, http, process.pid
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()

    async def run_variant(self, variant: str, starts_per_size: int) -> list[Level]:
        import httpx

        from examples.phone_bot.telephony import Balancer, PhoneCall
        levels = []
        async with self.worker(variant) as (url, http, pid):
            balancer = Balancer(PUBLIC_URL, [url])
            calls_http = httpx.AsyncClient(timeout=10)
            live: list[tuple[PhoneCall, asyncio.Task]] = []
            numbers = iter(range(1000, 10000))

            def place(call_sid: str | None = None) -> tuple[PhoneCall, asyncio.Task]:
                call = PhoneCall(balancer, f"{PUBLIC_URL}/twiml", f"+1555000{next(numbers)}",
                                 speech_s=0.0, timeout_s=3600)
                if call_sid:
                    call.call_sid = call_sid
                return call, asyncio.create_task(call.run(calls_http))

            async def lags(since: float, until: float) -> float:
                answer = (await http.get(f"{url}/rig/loop-lag",
                                         params={"since": since, "until": until})).json()
                return max((late for _, late in answer["samples"]), default=0.0)

            def others_gap(since: float, until: float) -> float:
                return max((heard_gaps(s.media, since, until)
                            for c, _ in live for s in c.streams[-1:]), default=0.0)

            try:
                for size in SIZES:
                    while len(live) < size:  # ramp up, then let the starts settle
                        live.append(place())
                        await asyncio.sleep(0.3)
                    # Measured once every live call's bot speaks (a loaded machine takes seconds).
                    for _ in range(600):
                        if all(c.streams and c.streams[-1].media for c, _ in live):
                            break
                        await asyncio.sleep(0.1)
                    await asyncio.sleep(1.0)
                    level = Level(variant, size, load=os.getloadavg()[0])
                    pending: list = []
                    quiet_from, cpu_from = time.time(), cpu_seconds(pid)
                    callers_from = cpu_seconds(os.getpid())
                    model_from, machine_from = cpu_seconds(self.gemini_pid), machine_busy_seconds()
                    await asyncio.sleep(EVERY_S)
                    quiet_to = time.time()
                    window = quiet_to - quiet_from
                    level.quiet_cpu = (cpu_seconds(pid) - cpu_from) / window
                    level.callers_cpu = (cpu_seconds(os.getpid()) - callers_from) / window
                    level.model_cpu = (cpu_seconds(self.gemini_pid) - model_from) / window
                    busy, total = machine_busy_seconds()
                    level.machine_busy = ((busy - machine_from[0])
                                          / max(1e-9, total - machine_from[1]))
                    level.quiet_lag_ms = await lags(quiet_from, quiet_to) * 1e3
                    level.quiet_gap_ms = others_gap(quiet_from, quiet_to) * 1e3
                    silent = [c for c, _ in live if not c.streams or heard_gaps(
                        c.streams[-1].media, quiet_from, quiet_to) >= 0.9 * (quiet_to - quiet_from)]
                    if silent:  # a worker too starved to keep its calls' audio going
                        level.errors.append(f"{len(silent)} of {len(live)} live calls silent "
                                            f"for the whole quiet window (no start in it)")
                    current: tuple[PhoneCall, asyncio.Task] | None = None
                    for k in range(starts_per_size):
                        at = time.time()
                        if k % 2 == 0:
                            current = place()
                            kind = "new"
                        else:  # its stream drops (no `stop`): the call is taken over
                            current[1].cancel()
                            await asyncio.gather(current[1], return_exceptions=True)
                            current = place(current[0].call_sid)
                            kind = "takeover"
                        await asyncio.sleep(max(0.0, at + EVERY_S - time.time()))
                        start = Start(kind, at, await lags(at, at + EVERY_S) * 1e3,
                                      others_gap(at, at + EVERY_S) * 1e3)
                        level.starts.append(start)
                        pending.append((start, current[0]))
                    if current is not None:
                        current[1].cancel()
                        await asyncio.gather(current[1], return_exceptions=True)
                    for start, call in pending:  # (a takeover's call object is its own)
                        first = next((s.first_audio_at for s in call.streams
                                      if s.first_audio_at), None)
                        if first is None:
                            level.errors.append(f"{start.kind} {call.call_sid[:10]}: no bot "
                                                f"audio ({call.error})")
                        else:
                            start.first_audio_s = first - start.at
                    levels.append(level)
            finally:
                for _, task in live:
                    task.cancel()
                await asyncio.gather(*(t for _, t in live), return_exceptions=True)
                await calls_http.aclose()
        return levels


async def own_lag(samples: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        before = loop.time()
        await asyncio.sleep(LAG_TICK_S)
        samples.append(loop.time() - before - LAG_TICK_S)


def report(levels: list[Level], own: list[float]) -> dict:
    from callmix import machine, pct
    print(f"\n{machine()}; the callers' own loop lag (this process, the floor of the gaps): "
          f"p99 {pct(own, 99) * 1e3:.1f} ms")
    print(f"{'live':>4} {'variant':7} {'load':>5} {'busy':>4} {'cpu':>4} {'rig':>4} "
          f"{'quiet lag':>9} "
          f"{'quiet gap':>9} | per start: {'lag p50':>7} {'lag max':>7} {'gap p50':>7} {'gap max':>7} "
          f"{'1st audio p50':>13}  (ms)")
    out = {}
    for level in levels:
        lag = [s.lag_ms for s in level.starts]
        gap = [s.gap_ms for s in level.starts]
        firsts = [s.first_audio_s for s in level.starts if s.first_audio_s is not None]
        row = {"load": round(level.load, 2), "worker_cpu": round(level.quiet_cpu, 2),
               "worker_cpu_per_call": round(level.quiet_cpu / max(1, level.live), 3),
               "callers_cpu": round(level.callers_cpu, 2), "model_cpu": round(level.model_cpu, 2),
               "machine_busy": round(level.machine_busy, 2),
               "quiet_lag_ms": round(level.quiet_lag_ms, 1),
               "quiet_gap_ms": round(level.quiet_gap_ms, 1),
               "lag_p50_ms": round(pct(lag, 50), 1), "lag_max_ms": round(max(lag), 1),
               "gap_p50_ms": round(pct(gap, 50), 1), "gap_max_ms": round(max(gap), 1),
               "first_audio_p50_ms": round(pct(firsts, 50) * 1e3, 1),
               "starts": [[s.kind, round(s.lag_ms, 1), round(s.gap_ms, 1)]
                          for s in level.starts], "errors": level.errors}
        out.setdefault(str(level.live), {})[level.variant] = row
        print(f"{level.live:>4} {level.variant:7} {level.load:>5.1f} {level.machine_busy:>4.0%} "
              f"{level.quiet_cpu:>4.0%} {level.callers_cpu + level.model_cpu:>4.0%} "
              f"{row['quiet_lag_ms']:>9.1f} "
              f"{row['quiet_gap_ms']:>9.1f} | {'':11}{row['lag_p50_ms']:>7.1f} "
              f"{row['lag_max_ms']:>7.1f} {row['gap_p50_ms']:>7.1f} {row['gap_max_ms']:>7.1f} "
              f"{row['first_audio_p50_ms']:>13.0f}")
        for error in level.errors:
            print(f"     ! {error}")
    print("\nratios ours/stock (per start, max):")
    for live, pair in out.items():
        if {"ours", "stock"} <= pair.keys():
            o, s = pair["ours"], pair["stock"]
            print(f"  {live:>2} live calls: loop lag {o['lag_max_ms']:.1f}/{s['lag_max_ms']:.1f} "
                  f"ms = {o['lag_max_ms'] / max(s['lag_max_ms'], 0.1):.2f}; other calls' gap "
                  f"{o['gap_max_ms']:.1f}/{s['gap_max_ms']:.1f} ms = "
                  f"{o['gap_max_ms'] / max(s['gap_max_ms'], 0.1):.2f}")
    print("target at 20 live calls: loop lag <= 20 ms per start, no gap over 60 ms")
    return out


async def bench(db: str, starts: int, variants: list[str]) -> dict:
    from rig.crash.harness import Databases
    with tempfile.TemporaryDirectory(prefix="call-start-") as tmp:
        workdir = Path(tmp)
        gemini = subprocess.Popen(
            [sys.executable, "-m", "service.local_live", "--script",
             f"{ROOT / 'bench' / 'call_start_script.py'}:talk_on"], cwd=ROOT,
            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
        databases = Databases(db, workdir)
        own: list[float] = []
        stop = asyncio.Event()
        probing = asyncio.create_task(own_lag(own, stop))
        try:
            ready = json.loads(await asyncio.to_thread(gemini.stdout.readline))
            levels = []
            for variant in variants:  # a fresh database each: the same work for both
                url, schema = await databases()
                levels += await Bench(url, schema, workdir, ready,
                                      gemini.pid).run_variant(variant, starts)
        finally:
            stop.set()
            await probing
            gemini.send_signal(signal.SIGTERM)
            gemini.wait(15)
            await databases.cleanup()
        print(f"db {db}; {starts} starts per size (new calls and takeovers alternately)")
        return report(levels, own)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 starts per size (CI)")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--only", choices=["ours", "stock"], help="one variant only")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    variants = [args.only] if args.only else ["ours", "stock"]
    figures = asyncio.run(bench(args.db, 4 if args.quick else 10, variants))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
