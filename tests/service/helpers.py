"""Harness for the wire scenarios: one scripted call through a real pipecat pipeline.

`run_call(flavour, scripts, drive)` starts a LocalLiveServer with `scripts`, builds the
service (ours on a store, or pipecat's stock GeminiLiveLLMService), runs
`user aggregator → service → PlaybackOutput → Tap → assistant aggregator` with pipecat's own
runner, lets `drive(ctl)` steer the call (queue frames, wait for server conditions), ends the
pipeline and returns everything a test asserts on: the server's record, the tool ledger (with
times), what the output transport did (Tap), and — for our service — the call's event log and
its projection.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from pipecat.frames.frames import (BotStartedSpeakingFrame, BotStoppedSpeakingFrame, EndFrame,
                                   Frame, LLMRunFrame, TTSAudioRawFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService
from pipecat.services.llm_service import FunctionCallParams

from service.gemini_live import DurableGeminiLiveLLMService
from service.local_live import HandleRecord, LocalLiveServer, Script, ToolResult
from rig.testing.pipeline import MODEL, PlaybackOutput, ToolLedger, make_tool, run_worker, tools_schema
from session_store import Policy, RecordedEvent, SessionState, load_state, open_store
from session_store.storage.migrate import upgrade
from session_store.models import rules_for
from session_store.storage import SqlEventStore
from session_store.delivery import unanswered, undelivered
from session_store.audit.verify import verify_log

PROMPT = "Be brief."
TOOLS = ("lookup_order", "get_weather")


@contextlib.asynccontextmanager
async def migrated_sqlite(path, **options):
    """A store on a freshly migrated SQLite file at `path`, closed on the way out."""
    url = f"sqlite+aiosqlite:///{path}"
    await upgrade(url)
    store = await open_store(url, **options)
    try:
        yield store
    finally:
        await store.close()


# --------------------------------------------------------------------------- service flavours

@dataclass
class Flavour:
    """Which service a scenario runs: ours on a database, or pipecat's stock service."""

    name: str  # sqlite | postgres | stock
    store: SqlEventStore | None = None
    model: str = MODEL  # the model the setup names (conftest: GEMINI_MODELS)

    @property
    def durable(self) -> bool:
        return self.store is not None

    def make_llm(self, server: LocalLiveServer, *, call_id: str, system_instruction: str,
                 tools: Sequence[str], policy: Policy | None, model: str | None = None,
                 **extra: Any) -> GeminiLiveLLMService:
        common = dict(
            api_key="local-test-key",
            settings=GeminiLiveLLMService.Settings(model=model or self.model,
                                                   system_instruction=system_instruction),
            tools=tools_schema(list(tools)), http_options=server.http_options())
        # Arguments of pipecat's own service go to both; the rest are ours.
        common.update({k: extra.pop(k) for k in PARENT_ARGUMENTS if k in extra})
        if not self.durable:
            return GeminiLiveLLMService(**common)
        return DurableGeminiLiveLLMService(**common, store=self.store, call_id=call_id,
                                           policy=policy, **extra)


PARENT_ARGUMENTS = ("function_call_timeout_secs",)


# --------------------------------------------------------------------------- observation

class Tap(FrameProcessor):
    """Sits right after the output transport: when it said the bot started/stopped speaking,
    and when each audio frame came out of it (wall-clock times, comparable with the log's)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.speech: list[tuple[str, float]] = []  # ("start" | "stop", time)
        self.audio_at: list[float] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            now = time.time()
            if isinstance(frame, BotStartedSpeakingFrame):
                self.speech.append(("start", now))
            elif isinstance(frame, BotStoppedSpeakingFrame):
                self.speech.append(("stop", now))
            elif isinstance(frame, TTSAudioRawFrame):
                self.audio_at.append(now)
        await self.push_frame(frame, direction)

    @property
    def speaking(self) -> bool:
        return bool(self.speech) and self.speech[-1][0] == "start"

    def intervals(self) -> list[tuple[float, float | None]]:
        """(start, stop) of each stretch of bot speech; stop None if it never ended."""
        out: list[tuple[float, float | None]] = []
        for kind, at in self.speech:
            if kind == "start":
                out.append((at, None))
            elif out and out[-1][1] is None:
                out[-1] = (out[-1][0], at)
        return out

    def speaking_at(self, t: float) -> bool:
        return any(start <= t and (stop is None or t < stop) for start, stop in self.intervals())

    def first_stop_after(self, t: float) -> float | None:
        return next((at for kind, at in self.speech if kind == "stop" and at >= t), None)


class TimedLedger(ToolLedger):
    def write(self, entry: dict[str, Any]) -> None:
        super().write({**entry, "t": time.time()})


@dataclass
class Ctl:
    """What a scenario's `drive` gets: the live call, to steer and watch it."""

    server: LocalLiveServer
    task: PipelineWorker
    llm: GeminiLiveLLMService
    tap: Tap
    ledger: TimedLedger
    marks: dict[str, float] = field(default_factory=dict)

    async def wait(self, condition: Callable[[], bool], timeout: float = 8.0) -> bool:
        """Wait for a condition; False on timeout, or as soon as the server saw a violation
        (the stock service often never gets there: the assertions afterwards, not a
        timeout, then say what went wrong, and the xfail runs stay short)."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() >= deadline or self.server.violations:
                return False
            await asyncio.sleep(0.02)
        return True

    async def run_llm(self) -> None:
        """The pipeline's first context: pipecat seeds a fresh session with it."""
        await self.task.queue_frames([LLMRunFrame()])

    async def settle(self, seconds: float = 0.4) -> None:
        await asyncio.sleep(seconds)

    def mark(self, name: str) -> None:
        self.marks[name] = time.time()

    def results(self, call_id: str | None = None) -> list[ToolResult]:
        return [r for r in self.server.tool_responses() if call_id is None or r.id == call_id]

    def script_done(self, connection: int) -> bool:
        """The connection's scripted steps have all been sent (it may still be open)."""
        session = self.server._sessions.get(connection)  # noqa: SLF001 - test harness
        return (session is not None and session.steps_done) or (
            len(self.server.connections) > connection
            and not self.server.connections[connection].is_open)


@dataclass
class CallRun:
    """Everything a scenario asserts on, after the call ended."""

    flavour: Flavour
    call_id: str
    server: LocalLiveServer
    ledger: TimedLedger
    tap: Tap
    marks: dict[str, float]
    events: list[RecordedEvent] = field(default_factory=list)
    state: SessionState | None = None

    # ---- server side
    def results(self, call_id: str | None = None) -> list[ToolResult]:
        return [r for r in self.server.tool_responses() if call_id is None or r.id == call_id]

    def results_named(self, name: str) -> list[ToolResult]:
        return [r for r in self.server.tool_responses() if r.name == name]

    @property
    def connections(self):
        return self.server.connections

    # ---- ledger
    def runs(self, call_id: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.ledger.runs if call_id is None or r["call_id"] == call_id]

    # ---- log
    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def find(self, type_: str, **match: Any) -> list[RecordedEvent]:
        return [e for e in self.events if e.type == type_
                and all(e.data.get(k) == v for k, v in match.items())]

    def at(self, type_: str, **match: Any) -> int:
        """Version of the first event of that type matching `match` (KeyError if none)."""
        found = self.find(type_, **match)
        if not found:
            raise KeyError(f"no {type_} {match} in the log:\n{self.timeline()}")
        return found[0].version

    def timeline(self) -> str:
        return "\n".join(f"  {e.version:3d} {e.type} {e.data_json[:140]}" for e in self.events)


async def run_call(flavour: Flavour, scripts: Sequence[Script] | Script | Callable[..., Script],
                   drive: Callable[[Ctl], Awaitable[None]], *,
                   tool_delay: float | dict[str, float] = 0.05,
                   tools: Sequence[str] = TOOLS, policy: Policy | None = None,
                   system_instruction: str = PROMPT, timeout: float = 40.0,
                   end_timeout: float = 3.0, call_id: str | None = None,
                   run_first: bool = True, messages: Sequence[dict[str, Any]] | None = None,
                   server_handles: Mapping[str, HandleRecord] | None = None,
                   model: str | None = None, progress: Mapping[str, int] | None = None,
                   prepare: Callable[[GeminiLiveLLMService], None] | None = None,
                   keep_audio: bool = False, **llm_extra: Any) -> CallRun:
    """`call_id`: a call whose log a test wrote beforehand (a takeover); `run_first=False`:
    the pipeline's first context (LLMRunFrame) is left to `drive` (`ctl.run_llm()`);
    `messages`: the pipeline context's opening messages (one user "Hello" by default);
    `server_handles`: handles the server issued before this worker (to a dead one);
    `model`: the model the setup names (the server applies its generation's rules; by
    default the flavour's: conftest's GEMINI_MODELS);
    `progress`: tools that report that many intermediate results (registered as async
    tools, cancel_on_interruption=False: pipecat declares them NON_BLOCKING);
    `prepare(llm)`: called once the tools are registered, before the pipeline starts;
    `keep_audio`: the server records the audio it receives, not only its size."""
    call_id = call_id or f"call-{uuid.uuid4().hex[:10]}"
    ledger = TimedLedger()
    tap = Tap()
    # A Script for every connection, a list (one per connection) or a callable choosing one.
    source = scripts if isinstance(scripts, Script) or callable(scripts) else list(scripts)
    model = model or flavour.model
    # A real model says nothing before it has input: a fresh session's script waits for the
    # client's first message (its seed; 3.x refuses a seed after the model's first output).
    async with LocalLiveServer(source, hold_until_input=2.0, keep_audio=keep_audio) as server:
        server.handles.update(server_handles or {})
        llm = flavour.make_llm(server, call_id=call_id, system_instruction=system_instruction,
                               tools=tools, policy=policy, model=model, **llm_extra)
        progress = dict(progress or {})
        for name in tools:
            delay = tool_delay.get(name, 0.05) if isinstance(tool_delay, dict) else tool_delay
            llm.register_function(name, make_tool(name, ledger, delay,
                                                  progress=progress.get(name, 0)),
                                  cancel_on_interruption=name not in progress)
        if prepare is not None:
            prepare(llm)
        context = LLMContext(messages=list(messages or [{"role": "user", "content": "Hello"}]))
        aggregators = LLMContextAggregatorPair(context)
        pipeline = Pipeline([aggregators.user(), llm, PlaybackOutput(), tap,
                             aggregators.assistant()])
        task = PipelineWorker(pipeline, params=PipelineParams(), cancel_on_idle_timeout=False)
        ctl = Ctl(server, task, llm, tap, ledger)
        run = asyncio.create_task(run_worker(task))
        try:
            if run_first:
                await ctl.run_llm()
            await asyncio.wait_for(drive(ctl), timeout)
        finally:
            await task.queue_frame(EndFrame())
            done, _ = await asyncio.wait({run}, timeout=end_timeout)
            if not done:  # e.g. the stock service waits 30 s for a turn that never completes
                await task.cancel()
                await asyncio.gather(run, return_exceptions=True)
    result = CallRun(flavour, call_id, server, ledger, tap, ctl.marks)
    if flavour.durable:
        result.events = await flavour.store.read(call_id)
        result.state = await load_state(flavour.store, call_id, use_snapshot=False)
    return result


# --------------------------------------------------------------------------- common checks

def assert_server_clean(run: CallRun, allow: Sequence[str] = ()) -> None:
    run.server.assert_clean(allow=allow)
    rejected = [r for r in run.results() if not r.accepted]
    assert not rejected, f"results the server did not take in: {rejected}"


BLOCKING_CALLS = pytest.mark.generations(
    "2.5", "3.1", "3.8", reason="the scenario's calls are blocking ones, deferred while the "
                                "bot speaks; on 3.8 thinking every call is NON_BLOCKING, not "
                                "deferred by default (tests/service/test_generations.py)")
PROMPT_RECONNECTS = pytest.mark.generations(
    "2.5", "3.1", reason="a prompt change reconnects only where the model takes no contextUpdate "
                         "(3.8 on: tests/service/test_generations.py)")


def content_via(run: CallRun, *, logged: bool = False) -> str:
    """How a result for a call the session never issued reaches the server (ToolResult.via,
    or with `logged` the log's `via`): clientContent on 2.5, realtimeInput.text from 3.1 on
    (a seed is clientContent on all)."""
    if rules_for(run.flavour.model).client_content_mid_session:
        return "content"
    return "text" if logged else "realtime"


def resumes_past_a_call(run: CallRun) -> bool:
    """Is a handle issued before a call the log has resumed from? On 2.5 (the session is told
    the call as content) and by stock pipecat; from 3.1 on it is not: the new session is
    fresh and its seed names the call (session_store.lineage.unheld_calls)."""
    return not run.flavour.durable or rules_for(run.flavour.model).client_content_mid_session


def generation_of(run: CallRun) -> str:
    return rules_for(run.flavour.model).family


def assert_answered_once(run: CallRun, call_id: str, name: str, *, via: str | None = None,
                         connection: int | None = None) -> ToolResult:
    """Exactly one result for the call reached the server, under the right function name."""
    got = run.results(call_id)
    assert len(got) == 1, f"{call_id}: expected one result, the server got {got}"
    result = got[0]
    assert result.name == name, f"{call_id}: answered as {result.name!r}, not {name!r}"
    assert result.accepted, f"{call_id}: the server rejected {result}"
    if via is not None:
        assert result.via == via, f"{call_id}: delivered by {result.via}, expected {via}"
    if connection is not None:
        assert result.connection == connection, (
            f"{call_id}: delivered on connection {result.connection}, expected {connection}")
    return result


def assert_ran_once(run: CallRun, call_id: str) -> dict[str, Any]:
    runs = run.runs(call_id)
    assert len(runs) == 1, f"{call_id}: the tool ran {len(runs)} times: {run.ledger.runs}"
    return runs[0]


async def assert_cancelled_after_start(run: CallRun, call_id: str) -> None:
    """A call cancelled once it had started: it ran once (pipecat cancels the task; what it
    did is not undone), was never answered, and the log (durable runs) says so in order."""
    assert_ran_once(run, call_id)
    assert run.results(call_id) == [], "a cancelled call was answered"
    assert_server_clean(run)
    if run.flavour.durable:
        assert run.at("tool.call_started", call_id=call_id) < run.at("tool.call_cancelled",
                                                                     call_id=call_id)
        assert not run.find("tool.result_sending", call_id=call_id)
        assert run.state.calls[call_id].status == "cancelled"
        assert_log_settled(run)
        await assert_chain_ok(run)


def assert_no_fallback_names(run: CallRun) -> None:
    bad = run.results_named("tool_call_result")
    assert not bad, f"results sent under pipecat's fallback name 'tool_call_result': {bad}"


def assert_log_settled(run: CallRun, *, anomalies: int = 0) -> None:
    """The projection of our log at the end of the call: nothing left to do, nothing odd."""
    if not run.flavour.durable:
        return
    state = run.state
    assert state is not None and state.closed, f"call not closed:\n{run.timeline()}"
    assert undelivered(state) == [], f"undelivered results:\n{run.timeline()}"
    assert unanswered(state) == [], f"calls never settled:\n{run.timeline()}"
    assert not state.pending(), f"deferred calls never started:\n{run.timeline()}"
    assert state.anomalies == anomalies, f"anomalies in the log:\n{run.timeline()}"
    assert not [c for c in state.calls.values() if c.status in ("requested", "started")], (
        f"calls still open:\n{run.timeline()}")
    versions = [e.version for e in run.events]
    assert versions == list(range(1, len(versions) + 1)), "gap in the stream"


async def assert_chain_ok(run: CallRun) -> None:
    if run.flavour.durable:
        (report,) = await verify_log(run.flavour.store, run.call_id)
        assert report.ok, report


def in_order(run: CallRun, *versions: int) -> bool:
    return all(a < b for a, b in itertools.pairwise(versions))


def handles_of(server: LocalLiveServer, connection: int) -> list[str]:
    """Handles the server issued on a connection, oldest first."""
    return [h.handle for h in sorted(server.handles.values(), key=lambda h: h.at)
            if h.connection == connection]
