"""Run a reproduction written by `session-store reproduce` (session_store/audit/reproduce.py).

Today's DurableGeminiLiveLLMService runs in a real pipecat pipeline against the local Gemini
Live server. Every stimulus waits for its gate, the version the re-run's log must reach
first: the server's steps (`WaitSignal`), the tools' results, the bot's playback ending, the
app's settings changes and hang-up, and each worker's death (a takeover in the log). A dying
worker's appends past its last logged version never commit (it is fenced); then it is
cancelled and the next worker takes the call over on the same database.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecat.frames.frames import (EndFrame, FunctionCallResultProperties, LLMRunFrame,
                                   LLMUpdateSettingsFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

from service import local_live as kit
from service.driver import now_us
from service.gemini_live import (PLAYBACK_LEAD_S, CannotTell, Done,
                                 DurableGeminiLiveLLMService, NotDone)
from service.headless_pipeline import PlaybackOutput, run_worker, tools_schema
from session_store import Policy, open_store
from session_store.audit import Redactor, export_line
from session_store.audit.redaction.config import RedactionConfig
from session_store.audit.reproduce import (Divergence, first_divergence, observed_kinds, read,
                                           unlogged_observation)
from session_store.errors import Fenced
from session_store.events import ObservationRecorded

# No new event for this long: the re-run is stuck (it waits for a decision the log has and
# today's code does not take); it stops and the comparison names the decision.
STALL_S = 10.0
# From a worker's start to its takeover's record time (its pipeline and the log's read).
WORKER_START_US = 30_000
# How long an append waits for a stimulus released while it is under way to be handed to
# the service (a few loop turns of plain Python: the tool's callback to the log's lock).
HANDOVER_S = 0.05
_SETTINGS = ("model", "system_instruction", "voice", "language")
# How long an append waits for a held playback's audio to play out (a turn's one chunk is
# 40 ms): past it, the re-run goes on and the comparison shows what came out of order.
PLAYED_S = 1.0
# How long the server's steps behind a playback's stop wait for the re-run's transport to
# stop (a turn's audio is as long as logged): past it they go, and the comparison shows it.
STOP_WAIT_S = 10.0


@dataclass
class Result:
    divergence: Divergence | None
    actual: list[dict[str, Any]]
    violations: list[dict[str, Any]]


class _Progress:
    """The re-run's log version, as the log numbers it (its observations of kinds the log
    never holds not counted: `as_logged`), and who waits for it."""

    def __init__(self, on_version: Callable[[int], None], logged: frozenset[str],
                 on_during: Callable[[int], None] = lambda before: None,
                 steps_during: frozenset[int] = frozenset()) -> None:
        self.version = 0
        self.logged = logged
        self.unlogged = 0  # the re-run's observations not counted so far
        self.appending = -1  # the version an append under way starts from
        self._during: dict[int, int] = {}  # stimuli waiting for the commit from a version
        self._changed = asyncio.Condition()
        self._on_version = on_version
        # The versions whose commit the server's steps are released during (`on_during`),
        # as a result is: the log shows the message came in while that commit was in flight.
        self._steps_during = set(steps_during)
        self._on_during = on_during

    async def begin_append(self, before: int) -> None:
        """An append from version `before` begins: stimuli that arrived while it was under
        way in the call are released now, and reach the service before it returns."""
        async with self._changed:
            self.appending = max(self.appending, before)
            waiting = self._during.get(before, 0) + self._release_steps(self.appending)
            self._changed.notify_all()
        if waiting:
            await asyncio.sleep(HANDOVER_S)

    async def during_commit(self, before: int) -> None:
        """Until the append from version `before` begins (at once if the log is past it)."""
        async with self._changed:
            self._during[before] = self._during.get(before, 0) + 1
            try:
                await self._changed.wait_for(lambda: self.appending >= before
                                             or self.version > before)
            finally:
                self._during[before] -= 1

    async def advance(self, version: int) -> None:
        async with self._changed:
            for v in range(self.version + 1, version + 1):
                self._on_version(v)
            self.version = max(self.version, version)
            self._release_steps(self.version - 1)  # the log is past them: at once
            self._changed.notify_all()

    def _release_steps(self, before: int) -> int:
        """Release the server's steps waiting for a commit from `before` or earlier."""
        due = sorted(v for v in self._steps_during if v <= before)
        for v in due:
            self._steps_during.discard(v)
            self._on_during(v)
        return len(due)

    async def reached(self, version: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.version >= version)

    async def changed(self, timeout: float) -> bool:
        async with self._changed:
            before = self.version
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(lambda: self.version > before),
                                       timeout)
            return self.version > before


class _HeldPlayback(PlaybackOutput):
    """Plays the bot's audio only while the log is where the original call's playback
    ended (so the bot stops speaking at the same decision)."""

    def __init__(self, progress: _Progress, windows: list[dict[str, int]],
                 played: dict[int, asyncio.Event]):
        super().__init__()
        self._progress, self._windows, self._played = progress, windows, played

    def _open(self) -> bool:
        v = self._progress.version
        return any(w["from"] <= v < w["until"] for w in self._windows)

    async def write_audio_frame(self, frame) -> bool:
        while not self._open():
            await self._progress.changed(1.0)
        done = await super().write_audio_frame(frame)
        for w in self._windows:  # (the window's audio is out: its stop follows)
            if w["from"] <= self._progress.version < w["until"] and w["from"] in self._played:
                self._played[w["from"]].set()
        return done


async def _steps_after_stop(progress: _Progress, window: int, speech: dict[str, Any],
                            server) -> None:
    """Release the server's steps the log has behind the stop of the playback from
    `window` (in its commit: they came after it) once the re-run's transport has played that
    audio and stopped, and the service has noted the stop."""
    with contextlib.suppress(asyncio.TimeoutError):
        async with asyncio.timeout(STOP_WAIT_S):
            await progress.reached(window)
            for speaking in (True, False):  # (it plays from the window on, then stops)
                while (tracker := speech.get("tracker")) is None \
                        or tracker.transport_speaking is not speaking:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(HANDOVER_S)
    server.signal(_played_signal(window))


def _played_signal(window: int) -> str:
    return f"played v{window}"


def _during_signal(before: int) -> str:
    """The signal of the server's steps released while the commit from `before` is under way."""
    return f"during v{before}"


def _script(conn: dict[str, Any]) -> kit.Script:
    if conn["refuse"] == "handle":
        return kit.Script.refusing_handle()
    if conn["refuse"] is not None:
        return kit.Script(refuse_setup=conn["refuse"])
    steps: list[kit.Step] = []
    for s in conn["steps"]:
        gate = _during_signal(s["at"]) if s.get("during_commit") else f"v{s['at']}"
        steps.append(kit.WaitSignal(gate))
        if s.get("after_played") is not None:
            steps.append(kit.WaitSignal(_played_signal(s["after_played"])))
        args = dict(s["args"])
        if s["step"] == "ToolCall":
            args["calls"] = [kit.Call(c["id"], c["name"], c["args"]) for c in args["calls"]]
        steps.append(getattr(kit, s["step"])(**args))
    return kit.Script(steps, reply=(), resumption_after_turn=False)


def _tool(spec, progress: _Progress, runs: dict[str, int], name: str):
    async def handler(params) -> None:
        call_id = params.tool_call_id
        run = runs.get(call_id, 0)
        runs[call_id] = run + 1
        logged = spec["tool_runs"].get(call_id, [])
        outcomes = logged[run]["outcomes"] if run < len(logged) else []
        if not outcomes:  # the log has no outcome of this run (its worker died first)
            await asyncio.Future()
        for out in outcomes:
            if out.get("during_commit"):
                await progress.during_commit(out["at"])
            else:
                await progress.reached(out["at"])
            if out["kind"] == "progress":
                await params.result_callback(out["value"], properties=FunctionCallResultProperties(
                    is_final=False, run_llm=False))
            elif out["kind"] == "error":
                raise RuntimeError(out["value"])
            else:
                await params.result_callback(out["value"])
    return handler


def _check(spec):
    def check(key: str, args: dict):
        answer = spec["outcome_checks"].get(spec["idempotency_keys"].get(key, ""), {})
        if answer.get("answer") == "done":
            return Done(answer.get("result"))
        if answer.get("answer") == "not_done":
            return NotDone()
        return CannotTell(answer.get("detail") or "the log has no answer")
    return check


async def _after_audio(store, call: str, after_us: int) -> None:
    """Wait until `after_us` (less a worker's start) after the re-run's bot message's first
    audio: a takeover as long after it as the log's, so it cuts what the log's cut."""
    said = [r for r in await store.read(call) if r.type == "conversation.message"
            and getattr(r.event, "audio_from_us", None)]
    if said:
        wait_us = said[-1].event.audio_from_us + after_us - now_us() - WORKER_START_US
        await asyncio.sleep(max(wait_us, 0) / 1e6)


async def _worker(spec, store, progress: _Progress, server, runs,
                  played: dict[int, asyncio.Event], speech: dict[str, Any],
                  playback_lead_s: float = PLAYBACK_LEAD_S) -> PipelineWorker:
    settings = {k: v for k, v in spec["settings"].items() if k in _SETTINGS}
    settings["model"] = spec["model"]  # (the settings' copy is masked under --redact)
    llm = DurableGeminiLiveLLMService(
        api_key="local-test-key", http_options=server.http_options(),
        settings=DurableGeminiLiveLLMService.Settings(**settings),
        tools=tools_schema(spec["tools"]), store=store, call_id=spec["call"],
        policy=Policy(idempotent=frozenset(spec["idempotent"])),
        playback_lead_s=playback_lead_s)
    speech["tracker"] = llm.speech
    for name in spec["tools"]:
        llm.register_function(name, _tool(spec, progress, runs, name),
                              cancel_on_interruption=spec["tool_modes"].get(name)
                              != "NON_BLOCKING")
    for name in spec["checked"]:
        llm.register_outcome_check(name, _check(spec),
                                   rerun_if_not_done=name in spec["rerun_if_not_done"])
    context = LLMContext(messages=spec["user_turns"] or [{"role": "user", "content": "Hello"}])
    pair = LLMContextAggregatorPair(context)
    pipeline = Pipeline([pair.user(), llm, _HeldPlayback(progress, spec["playback"], played),
                         pair.assistant()])
    return PipelineWorker(pipeline, params=PipelineParams(), cancel_on_idle_timeout=False)


def _mortal(store, progress: _Progress, last_version: int | None, dead: asyncio.Event,
            played: dict[int, asyncio.Event]):
    """The store as this worker sees it: appends advance the re-run; past `last_version`
    they wait, and fail as fenced once the worker is dead. An append that opens a playback
    the log shows ending during a send (`during_send`) returns once that audio is out, so
    the stop is noted before the send it came during is confirmed."""
    append = store.append

    async def append_logged(stream_id, events, expected_version, **kw):
        at = expected_version - progress.unlogged  # where the log was
        if last_version is not None and at >= last_version:
            await dead.wait()
            raise Fenced(stream_id, None, 0)
        await progress.begin_append(at)
        version = await append(stream_id, events, expected_version, **kw)
        progress.unlogged += sum(1 for e in events if unlogged_observation(
            e.TYPE, e.kind if isinstance(e, ObservationRecorded) else None, progress.logged))
        await progress.advance(version - progress.unlogged)
        out = played.get(version - progress.unlogged)
        if out is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(out.wait(), PLAYED_S)
            await asyncio.sleep(HANDOVER_S)  # the transport's stop, to the service's notes
        return version

    store.append = append_logged


async def _app(spec, worker, task: PipelineWorker, progress: _Progress) -> None:
    """What the app did: start the pipeline (every worker; a worker that took over and did
    nothing before its session, while that session's start commits; one whose seed ran on
    the context, after its session's start), its settings changes and its hang-up, each at
    its gate."""
    if worker.get("start_at") is not None:
        await progress.during_commit(worker["start_at"])
    if worker.get("context_after") is not None:
        await progress.reached(worker["context_after"])
    await task.queue_frames([LLMRunFrame()])
    for change in spec["settings_changes"]:
        if progress.version > change["at"]:
            continue
        await progress.reached(change["at"])
        # A masked value (--redact) stands for a new one all the same: a change to it.
        values: dict[str, Any] = {k: f"{v} (as of v{change['at']})" if v == "[REDACTED]"
                                  else v for k, v in change["values"].items()}
        await task.queue_frame(LLMUpdateSettingsFrame(
            delta=DurableGeminiLiveLLMService.Settings(**values)))
    if spec["end_at"] is not None:
        await progress.reached(spec["end_at"])
        await task.queue_frame(EndFrame())


async def run_reproduction(directory: Path | str, db_url: str, *, schema: str | None = None,
                           timeout_s: float = 120.0) -> Result:
    """Re-run the reproduction in `directory` on a fresh database; compare its log."""
    from session_store.storage.migrate import upgrade

    spec, expected = read(Path(directory))
    await upgrade(db_url, **({"schema": schema} if schema else {}))
    runs: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    scripts = [_script(c) for c in spec["connections"]]
    async with kit.LocalLiveServer(scripts) as server:
        steps_during = frozenset(s["at"] for c in spec["connections"] for s in c["steps"]
                                 if s.get("during_commit"))
        progress = _Progress(lambda v: server.signal(f"v{v}"), observed_kinds(expected),
                             lambda v: server.signal(_during_signal(v)), steps_during)
        played = {w["from"]: asyncio.Event() for w in spec["playback"] if w.get("during_send")}
        speech: dict[str, Any] = {}  # the live worker's SpeechTracker
        releases = [asyncio.create_task(_steps_after_stop(progress, w["from"], speech, server))
                    for w in spec["playback"] if w.get("steps_after")]
        server.signal("v0")
        stores = []
        try:
            for worker in spec["workers"]:
                store = await open_store(db_url, **({"schema": schema} if schema else {}))
                stores.append(store)
                dead = asyncio.Event()
                _mortal(store, progress, worker["last_version"], dead, played)
                if worker.get("after_audio_us") is not None:
                    await _after_audio(stores[0], spec["call"], worker["after_audio_us"])
                task = await _worker(spec, store, progress, server, runs, played, speech,
                                     worker.get("playback_lead_s", PLAYBACK_LEAD_S))
                run = asyncio.create_task(run_worker(task))
                app = asyncio.create_task(_app(spec, worker, task, progress))
                until = worker["last_version"]
                quiet_since = loop.time()
                while not run.done():
                    if until is not None and progress.version >= until:
                        break
                    if await progress.changed(0.2):
                        quiet_since = loop.time()
                    elif loop.time() - quiet_since > STALL_S:
                        break  # stuck: compare what it logged
                dead.set()
                app.cancel()
                if not run.done():
                    await task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.gather(run, app, return_exceptions=True), 5)
                if until is None or progress.version < until:
                    break
            actual = []
            # The re-run's log is seen as the reproduction's was (masked as --redact masks).
            redactor = Redactor(RedactionConfig(enabled=spec["redacted"]))
            for rec in await stores[0].read(spec["call"]):
                actual.append(export_line(rec, redactor))
        finally:
            for release in releases:
                release.cancel()
            for store in stores:
                await store.close()
        violations = list(server.violations)
    return Result(first_divergence(expected, actual, ignore_prompt_hash=spec["redacted"]),
                  actual, violations)
