"""What the durable log costs a live call: our service against pipecat's stock one, same run.

The same scripted call (N turns; each turn: model audio, a toolCall, the answer, more audio,
turnComplete) goes through a real pipecat pipeline (user aggregator → service → AudioTap →
PlaybackOutput → assistant aggregator) against the local Gemini Live server (in a process of
its own, as Gemini is on another machine: see ServerProcess), once with the
stock GeminiLiveLLMService and once with DurableGeminiLiveLLMService per database (SQLite file,
and PostgreSQL when it is reachable). The tool answers at once.

Printed per service:
- turn: toolCall sent by the server → toolResponse received by the server (p50/p99 ms),
  and ours minus stock (the log's added latency per tool call: two commits before the
  toolResponse leaves, the request with its start, then the result with the send intent);
- audio: a model audio chunk sent by the server → its TTSAudioRawFrame leaving the service
  (p50/p99/max ms), ours minus stock (what the log adds on the audio path).
- floor: the raw driver's two commits per turn on the same database, after the same idle
  spells as a turn's (bench/commit_floor.py), measured between the calls; what ours adds
  beyond it is the cost of our code rather than of the disk's syncs.

SQLite runs twice: `sqlite` is the default store (inline="never"), every commit in its
writer process (before 2026-12-01 a thread, whose commits waited for the GIL of the busy loop);
`sqlite-urgent` (inline="urgent") commits the two appends a tool call waits for (its start;
its result with the send intent) on the event loop's thread when the store is idle: no
thread hand-off for them, but their fsyncs hold the loop.

Deferral is switched off for this comparison (Policy(defer="none")): with it on, ours waits
for the bot to stop speaking before running a tool, which is the point of deferral and not
overhead. The deferral wait is measured separately, with the default policy, on calls that
arrive while the bot speaks: toolCall → tool start, and bot stopped (output transport) →
tool start (the reaction time once speech ended).

    python bench/turn_overhead.py            # 120 turns per service, 6 interleaved rounds
    python bench/turn_overhead.py --quick    # CI: 15 turns, 3 rounds (< 60 s)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

from loguru import logger
from pipecat.frames.frames import (BotStoppedSpeakingFrame, EndFrame, LLMRunFrame,
                                   TTSAudioRawFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService
from pipecat.services.llm_service import FunctionCallParams

from service.gemini_live import DurableGeminiLiveLLMService
from service.local_live import http_options
from rig.testing.pipeline import MODEL, PlaybackOutput, run_worker, tools_schema
from session_store.models import rules_for
from session_store import Policy, open_store
from session_store.storage.migrate import upgrade

from callmix import pct
from commit_floor import floor_for
from turn_scripts import TOOL, audio_chunks, deferral_script, overhead_script

PG_URL = os.environ.get("SESSION_STORE_BENCH_PG",
                        "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PG_DSN = PG_URL.replace("postgresql+asyncpg", "postgresql")

SCRIPTS = Path(__file__).resolve().parent / "turn_scripts.py"
BUILDERS = {"overhead_script": overhead_script, "deferral_script": deferral_script}


class AudioTap(FrameProcessor):
    """Right after the service: when each audio frame left it, when the transport stopped."""

    def __init__(self):
        super().__init__()
        self.audio_at: list[float] = []
        self.stops: list[float] = []

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            self.audio_at.append(time.time())
        elif isinstance(frame, BotStoppedSpeakingFrame) and direction == FrameDirection.UPSTREAM:
            self.stops.append(time.time())
        await self.push_frame(frame, direction)


class ServerProcess:
    """The local Gemini Live server in a process of its own, serving one call: it must not
    share the service's event loop, or whatever the service does after sending a
    toolResponse (ours logs that it was sent) would count as latency before the server
    "receives" it, and the server's own TLS and JSON work would land on the service's loop.
    Gemini is on another machine."""

    def __init__(self, script: str, turns: int, record: Path):
        self.spec, self.record = f"{SCRIPTS}:{script}:{turns}", record
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self):
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "service.local_live", "--script", self.spec,
            "--record", str(self.record), "--exit-after", "1",
            cwd=str(Path(__file__).resolve().parent.parent), stdout=asyncio.subprocess.PIPE)
        ready = json.loads(await asyncio.wait_for(self.proc.stdout.readline(), 30))
        self.http_options = http_options(ready["base_url"], ready["cert_path"])
        return self

    async def __aexit__(self, *exc):
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.terminate()
            await self.proc.wait()

    def connection(self, tolerated: frozenset[str] = frozenset()) -> dict:
        """The call's connection as the server recorded it; raises on any violation but the
        `tolerated` kinds (printed: stock pipecat's known breaches of a generation's rules)."""
        record = json.loads(self.record.read_text())
        violations = [v for v in record["violations"] if v["kind"] not in tolerated]
        if violations or record["errors"] or len(record["connections"]) != 1:
            raise AssertionError(f"the local server saw problems: {violations} "
                                 f"{record['errors']} ({len(record['connections'])} connections)")
        seen = sorted({v["kind"] for v in record["violations"]})
        if seen:
            print(f"  (stock pipecat broke the {MODEL_IN_USE} wire rules: {', '.join(seen)})")
        return record["connections"][0]


# pipecat 1.14 says willContinue only for functions it registered as async; a thinking model
# runs every call NON_BLOCKING, so stock leaves a sync tool's call open (the local server
# records it and takes the response as closing). Its turns still count: they are what a
# stock user gets.
STOCK_TOLERATED = frozenset({"will_continue_unset"})


MODEL_IN_USE = MODEL  # --model: the server applies that generation's wire rules
#: More PipelineWorker arguments (bench/observability.py: enable_tracing).
WORKER_OPTIONS: dict = {}


async def run_call(kind: str, script: str, turns: int, store=None, policy=None) -> dict:
    """One call; returns the server record, the audio tap and the tool start times."""
    tool_started: dict[str, float] = {}
    chunks = audio_chunks(BUILDERS[script](turns))
    with tempfile.TemporaryDirectory() as tmp:
        async with ServerProcess(script, turns, Path(tmp) / "record.json") as server:
            common = dict(api_key="bench", http_options=server.http_options,
                          settings=GeminiLiveLLMService.Settings(model=MODEL_IN_USE,
                                                                 system_instruction="Be brief."),
                          tools=tools_schema([TOOL]))
            if kind == "stock":
                llm = GeminiLiveLLMService(**common)
            else:
                llm = DurableGeminiLiveLLMService(**common, store=store, policy=policy,
                                                  call_id=f"bench-{uuid.uuid4().hex[:8]}")

            async def tool(params: FunctionCallParams):
                tool_started[params.tool_call_id] = time.time()
                await params.result_callback({"ok": True, "id": params.arguments.get("id")})

            llm.register_function(TOOL, tool)
            aggregators = LLMContextAggregatorPair(LLMContext(messages=[{"role": "user",
                                                                         "content": "Hello"}]))
            tap = AudioTap()
            task = PipelineWorker(Pipeline([aggregators.user(), llm, tap, PlaybackOutput(),
                                            aggregators.assistant()]),
                                  params=PipelineParams(), cancel_on_idle_timeout=False,
                                  **WORKER_OPTIONS)
            run = asyncio.create_task(run_worker(task))
            try:
                await task.queue_frames([LLMRunFrame()])
                # The server sends the audio after each answer only once the answer arrived:
                # all chunks through the service means every toolResponse reached the server.
                deadline = time.monotonic() + 30 + turns * 2
                while len(tap.audio_at) < chunks:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{kind}: {len(tap.audio_at)} of {chunks} audio "
                                           "chunks arrived")
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)
            finally:
                # Also after a failure: a pipeline left running is a task asyncio.run would
                # wait for at the end, perhaps for ever.
                await task.queue_frame(EndFrame())
                done, _ = await asyncio.wait({run}, timeout=30)
                if not done:
                    await task.cancel()
                    await asyncio.wait({run}, timeout=10)
        conn = server.connection(STOCK_TOLERATED if kind == "stock" else frozenset())
    return {"conn": conn, "tap": tap, "tool_started": tool_started}


class FullCollections:
    """This process's full (generation 2) garbage collections while it watches: when each
    began (time.time(), the clock of the server's record) and how long it stopped everything
    (ms). One lands in whichever service's turn happens to be running."""

    def __init__(self):
        self.pauses: list[tuple[float, float]] = []
        self._began: tuple[float, float] | None = None

    def _on_gc(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = (time.time(), time.perf_counter())
        elif self._began is not None:
            self.pauses.append((self._began[0], (time.perf_counter() - self._began[1]) * 1e3))
            self._began = None

    def start(self) -> FullCollections:
        gc.callbacks.append(self._on_gc)
        return self

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def within(self, windows: list[tuple[float, float]]) -> list[float]:
        """The pauses that began inside one of `windows` (a turn's toolCall → toolResponse)."""
        return [ms for at, ms in self.pauses if any(a <= at <= b for a, b in windows)]


def tool_calls_sent(conn: dict) -> dict[str, float]:
    """Call id → when the server sent its toolCall."""
    return {s["message"]["toolCall"]["functionCalls"][0]["id"]: s["at"] for s in conn["sent"]
            if isinstance(s["message"], dict) and "toolCall" in s["message"]}


def turn_windows(result: dict) -> list[tuple[float, float]]:
    """Per call: when the server sent its toolCall and when it received the toolResponse."""
    conn = result["conn"]
    sent = tool_calls_sent(conn)
    return [(sent[r["id"]], r["at"]) for r in conn["results"]]


def turn_latencies(result: dict) -> list[float]:
    """Per call: toolCall sent by the server → its toolResponse received, in ms."""
    return [(received - sent) * 1e3 for sent, received in turn_windows(result)]


def audio_latencies(result: dict) -> list[float]:
    """Per audio chunk: sent by the server → pushed out of the service, in ms."""
    conn = result["conn"]
    sent = [s["at"] for s in conn["sent"] if isinstance(s["message"], dict)
            and "modelTurn" in s["message"].get("serverContent", {})]
    pushed = result["tap"].audio_at
    if len(pushed) != len(sent):
        raise RuntimeError(f"{len(sent)} audio chunks sent, {len(pushed)} reached the tap")
    return [(p - s) * 1e3 for s, p in zip(sent, pushed)]


async def open_backend(name: str, tmp: str):
    if name.startswith("sqlite"):
        url = f"sqlite+aiosqlite:///{tmp}/bench-{uuid.uuid4().hex[:6]}.db"
        await upgrade(url)
        # Inline commits apply while the store serves one call (see the docstring).
        inline = {"sqlite": "never", "sqlite-urgent": "urgent"}[name]
        return await open_store(url, inline=inline), None
    import asyncpg
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_DSN, timeout=3)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
    finally:
        await conn.close()
    await upgrade(PG_URL, schema=schema)
    return await open_store(PG_URL, schema=schema), schema


async def drop_schema(schema: str) -> None:
    import asyncpg
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()


async def postgres_reachable() -> bool:
    try:
        import asyncpg
        conn = await asyncpg.connect(PG_DSN, timeout=2)
        await conn.close()
        return True
    except Exception:  # noqa: BLE001 - no PostgreSQL here: SQLite only
        return False


async def main(turns: int, rounds: int, deferral_turns: int, only: list[str] | None) -> None:
    backends = ["sqlite", "sqlite-urgent"] + (["postgres"] if await postgres_reachable() else [])
    backends = [b for b in backends if only is None or b in only]
    services = ["stock"] + [f"ours/{n}" for n in backends]
    turn_ms: dict[str, list[float]] = {k: [] for k in services}
    windows: dict[str, list[tuple[float, float]]] = {k: [] for k in services}
    audio_ms: dict[str, list[float]] = {k: [] for k in services}
    deferral: dict[str, list[dict]] = {n: [] for n in backends}
    # The raw driver's two commits per turn, spaced as a turn's are (bench/commit_floor.py):
    # the least a write-ahead tool call can add on this disk, measured between the calls.
    floors = {"postgres" if n == "postgres" else "sqlite" for n in backends}
    floor_ms: dict[str, list[float]] = {n: [] for n in floors}
    per_round = max(1, turns // rounds)
    with tempfile.TemporaryDirectory() as tmp:
        # Warm-up (imports, TLS, first pipeline): not measured.
        await run_call("stock", "overhead_script", 2)
        # What the imports made (pipecat, google-genai, SQLAlchemy: ~140,000 objects) is kept
        # out of the full collections: each would otherwise stop the whole process for 100-200
        # ms here, in whichever turn it lands. Workers should do the same after startup
        # (docs/operations.md).
        gc.collect()
        gc.freeze()
        collections = FullCollections().start()
        stores = {name: await open_backend(name, tmp) for name in backends}
        raw = {name: floor_for(name, tmp) for name in floors}
        try:
            for floor in raw.values():
                await floor.open()
            # Rounds interleave the services, so machine noise (other processes, GC) lands
            # on all of them alike instead of on whichever ran during a hiccup.
            for _ in range(rounds):
                for key in services:
                    if key == "stock":
                        res = await run_call("stock", "overhead_script", per_round)
                    else:
                        store = stores[key.split("/")[1]][0]
                        res = await run_call("ours", "overhead_script", per_round,
                                             store, Policy(defer="none"))
                    turn_ms[key] += turn_latencies(res)
                    windows[key] += turn_windows(res)
                    audio_ms[key] += audio_latencies(res)
                for name, floor in raw.items():
                    floor_ms[name] += await floor.turns(per_round)
            for name in backends:
                deferral[name].append(await run_call(
                    "ours", "deferral_script", deferral_turns, stores[name][0],
                    Policy()))
        finally:
            collections.stop()
            for floor in raw.values():
                await floor.close()
            for store, schema in stores.values():
                await store.close()
                if schema:
                    await drop_schema(schema)

    print(f"\nTurn overhead on {MODEL_IN_USE} ({rules_for(MODEL_IN_USE).family} wire rules, "
          f"stock pipecat on the same model): {per_round * rounds} turns per service in "
          f"{rounds} interleaved rounds; the tool answers at once; Policy(defer='none') for "
          f"ours")
    print(f"{'service':<20}{'turn p50':>9}{'p90':>8}{'p99':>8}{'+p50':>8}{'+p90':>8}{'+p99':>8}"
          f"{'audio p50':>11}{'p90':>7}{'p99':>8}{'+p50':>8}{'+p99':>8}")
    base_t, base_a = turn_ms["stock"], audio_ms["stock"]
    for key in services:
        t, a = turn_ms[key], audio_ms[key]
        row = f"{key:<20}{pct(t, 50):>9.2f}{pct(t, 90):>8.2f}{pct(t, 99):>8.2f}"
        row += ("" if key == "stock" else
                f"{pct(t, 50) - pct(base_t, 50):>+8.2f}{pct(t, 90) - pct(base_t, 90):>+8.2f}"
                f"{pct(t, 99) - pct(base_t, 99):>+8.2f}").rjust(24)
        row += f"{pct(a, 50):>11.2f}{pct(a, 90):>7.2f}{pct(a, 99):>8.2f}"
        row += ("" if key == "stock" else
                f"{pct(a, 50) - pct(base_a, 50):>+8.2f}{pct(a, 99) - pct(base_a, 99):>+8.2f}")
        print(row)
    print("(ms; turn = server sends toolCall -> server receives toolResponse; audio = server "
          "sends a chunk -> the service pushes its frame; + = ours minus stock)")
    hits = {key: collections.within(windows[key]) for key in services}
    print("Full garbage collections of this process during the run: " + (", ".join(
              f"{ms:.0f} ms" for _, ms in collections.pauses) or "none")
          + "; inside a measured turn: " + (", ".join(
              f"{key} {' '.join(f'{ms:.0f}' for ms in h)} ms" for key, h in hits.items() if h)
              or "none"))

    print("\nFloor: the raw driver's two commits per turn, after the same idle spells "
          "(bench/commit_floor.py), and what ours adds beyond them")
    for key in services[1:]:
        floor = floor_ms["postgres" if key.endswith("postgres") else "sqlite"]
        t = turn_ms[key]
        added = [pct(t, q) - pct(base_t, q) for q in (50, 90, 99)]
        print(f"{key:<20}floor p50 {pct(floor, 50):5.2f} p90 {pct(floor, 90):5.2f} "
              f"p99 {pct(floor, 99):5.2f}   added beyond it: "
              + " / ".join(f"{a - pct(floor, q):+.2f}" for a, q in zip(added, (50, 90, 99))))

    print(f"\nDeferral wait (default Policy, calls arriving mid-speech, {deferral_turns} calls)")
    if rules_for(MODEL_IN_USE).calls_default_non_blocking and \
            not rules_for(MODEL_IN_USE).blocking_declarations:
        print("  (every call is NON_BLOCKING on this model: not deferred by default, so the "
              "tool starts at once; the figures below are the toolCall -> start time)")
    for name in backends:
        res = deferral[name][0]
        sent = tool_calls_sent(res["conn"])
        waits, reactions = [], []
        for call_id, started in res["tool_started"].items():
            waits.append((started - sent[call_id]) * 1e3)
            # The transport stop that let it start: the last one before the start.
            stop = max((t for t in res["tap"].stops if sent[call_id] <= t <= started),
                       default=None)
            if stop is not None:
                reactions.append((started - stop) * 1e3)
        reacted = (f"bot stopped -> tool start p50 {pct(reactions, 50):5.2f} ms, "
                   f"p99 {pct(reactions, 99):5.2f} ms" if reactions
                   else "no call waited for the bot to stop")
        print(f"  ours/{name:<14} toolCall -> tool start p50 {pct(waits, 50):6.1f} ms, "
              f"p99 {pct(waits, 99):6.1f} ms (the bot's remaining speech); {reacted}")


async def main_or_exit(*args) -> None:
    """main(), and on a failure say why and exit at once, from inside the loop: asyncio.run
    would first cancel the tasks left behind and wait for them, and a pipecat task of a
    failed call that never finishes cancelling kept a CI run waiting."""
    try:
        await main(*args)
    except Exception:  # noqa: BLE001 - reported, then the process ends
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run (< 60 s)")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--backends", nargs="+", choices=["sqlite", "sqlite-urgent", "postgres"],
                        help="only these stores (default: all; postgres when reachable)")
    parser.add_argument("--model", default=MODEL,
                        help="the model the calls name, for stock and ours alike (the local "
                             "server applies its generation's wire rules; default "
                             "%(default)s)")
    args = parser.parse_args()
    MODEL_IN_USE = args.model
    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    turns = args.turns or (15 if args.quick else 120)
    asyncio.run(main_or_exit(turns, 3 if args.quick else 6, 4 if args.quick else 10,
                             args.backends))
