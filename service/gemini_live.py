"""DurableGeminiLiveLLMService: pipecat's Gemini Live service, driven by the call's event log.

This class is the one place that overrides pipecat's hooks; each hook hands what it sees to
a part that owns its own state:

- `log_writer` (log_writer.py): the one way to log a fact, in order, however long the
  database is down;
- `receiver` (receiver.py): server messages as facts (handles, goAway, cancellations, ...);
- `speech` (speech.py): the bot's speech between the log's facts, and `speech_log`
  (speech_log.py), which reports it to the log;
- `effects` (effects.py): performs what the log says is due (starts, results, sends);
- `results` (results.py): tool results, logged with the intent to send them;
- `session_link` (link.py): the session, its handle, reconnects and handshake failures;
- `seeder` (seeding.py): what a fresh session is told of the call so far;
- `setup_context` (setup_context.py): settings and tools, and what a setup carries now;
- `stepper` (step.py): the one step every commit goes through, and what follows from it.

The flow is always: an observation goes to the log writer, the driver decides it on the log
(session_store.decide) and appends the decision, then the effects due run: one step
(`stepper`, step.py), which also handles a newer worker's fencing (`on_fenced`). The parts
never write pipecat's attributes: they hand `apply` the `PipecatState` they want (port.py).
Startup after a crash is the same path: attach (new fencing epoch), connect with the handle
the log allows, and perform what is due. Every private pipecat hook overridden or read here
is pinned by tests/service/test_pipecat_contract.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any, Literal

from google.genai import Client
from google.genai.types import HttpOptions, ThinkingLevel
from loguru import logger
from pipecat.adapters.llm.schemas.direct_function import DirectFunction
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (CancelWorkerFrame, EndFrame, FunctionCallCancelFrame,
                                   FunctionCallResultFrame, InterruptionFrame, LLMSetToolsFrame,
                                   StartFrame)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.google.gemini_live.llm import (MAX_CONSECUTIVE_FAILURES,
                                                     GeminiLiveLLMService,
                                                     GeminiLiveLLMSettings, InputParams)

from session_store import Policy
from session_store.checks import check_count, check_seconds
from session_store.decide import SeedAsked, ServerMessageRejected, TakenOver
from session_store.delivery import ResolveInDoubt
from session_store.errors import CallClosed
from session_store.outcomes import CannotTell, Done, NotDone
from session_store.storage import SqlEventStore

from . import observe, tracing
from .client_options import with_shared_tls
from .caller_audio import CallerAudioHold
from .driver import CallDriver
from .effects import EffectRunner
from .handle_gate import HandleGate
from .link import RECONNECT_WINDOW_S, Link
from .log_writer import STARTS, LogWriter, When
from .outcome_checks import (CHECK_TIMEOUT_S, TOOL_GRACE_S, OutcomeCheck, OutcomeChecks,
                             wait_for_tools)
from .playback import PlaybackPosition
from .port import PipecatState
from .receiver import Receiver, parse_time_left
from .results import ResultIntake
from .seeding import Seeder
from .speech import SpeechTracker
from .speech_log import SpeechLog
from .step import Stepper
from .setup_context import SetupContext
from .translate import (RESTORED_SETTINGS, base_prompt, restored, settings_snapshot,
                        tool_names, tools_from_declarations)
from .watchdog import watch_silence
from .wire import guard_session, with_frame_limit

__all__ = ["CannotTell", "Done", "DurableGeminiLiveLLMService", "MAX_FRAME_BYTES", "NotDone",
           "base_prompt", "parse_time_left", "tools_from_declarations"]

#: The largest websocket frame the service reads (google-genai's default is 1 MiB). Larger
#: than Policy.max_args_bytes on purpose: a tool call with oversized arguments then arrives
#: and is answered with an explicit error, instead of the client closing the socket (1009)
#: on a call the model would ask for again on the resumed session, until pipecat gives up.
MAX_FRAME_BYTES = 16 << 20
#: pipecat's output transports write one chunk ahead of real time (audio_out_10ms_chunks=4:
#: 40 ms); what was written before a worker died is all the caller hears of it.
PLAYBACK_LEAD_S = 0.04
#: How much of the caller's audio waits for the next session (the newest; older is dropped):
#: more than a reconnect or takeover takes when it goes well.
CALLER_AUDIO_HOLD_S = 5.0


def _client_options(http_options: Any, max_frame_bytes: int) -> Any:
    """google-genai's options for a call's client (and the warm-up's): the process's TLS
    context and the frame limit."""
    return with_frame_limit(with_shared_tls(http_options), max_frame_bytes)


class DurableGeminiLiveLLMService(GeminiLiveLLMService):
    """Drop-in GeminiLiveLLMService whose behaviour is decided from a durable event log.

    Extra arguments: `store` (from `session_store.open_store`), `call_id` (the stream; an
    existing open call is taken over), `policy` (deferral, idempotent tools, reuse of
    re-issued calls), `worker_id`, `speaking_signal` ("transport": the bot speaks from the
    first model audio until the output transport's BotStoppedSpeakingFrame; "model": until
    turnComplete, for pipelines without an output transport; the transport's frames, if any,
    then only hold the watchdog off) and `speaking_timeout_s` (a
    safety net: with no model output and no transport signal for that long the bot counts as
    silent, so a server that holds turnComplete until it gets a tool response cannot
    deadlock the call). `snapshot_every`: events between snapshots of the call's decision
    state (a takeover of a long call loads the newest one and the events after it).
    `max_frame_bytes`: the largest server frame read (MAX_FRAME_BYTES).
    `reconnect_window_s`: connection failures in a row are retried for that long (with
    backoff) before the service is given up (RECONNECT_WINDOW_S; pipecat gave up at three),
    decided on the log on its clock, so a takeover goes on with the same window.
    `tool_grace_s`: how long a tool still running when the call ends may go on to log its
    outcome (after the end); one still running then stays in doubt.
    `playback_lead_s`: how far ahead of real time the pipeline writes the bot's audio (its
    transport's pacing): after a takeover, the bot's message the dead worker was playing
    counts as heard as far as its audio can have been written (PLAYBACK_LEAD_S;
    session_store/heard.py). `handed_over_at` (Unix seconds): when the deployment handed the
    call to this worker, if it knows (the phone bot: when the redirect's webhook was asked,
    its stream token's time); the dead worker's audio had stopped by then, so that is the bound used
    instead of the takeover's own, later, time.
    `caller_audio_hold_s`: the caller's audio that arrives while no session can take it (a
    reconnect, a takeover, a fresh session's seed) is held, up to its newest that many
    seconds, and sent to the next session before anything newer (caller_audio.py;
    CALLER_AUDIO_HOLD_S; 0: dropped, as pipecat does).
    """

    # (pipecat annotates it with a name its module rebinds, which a type checker cannot follow)
    _settings: GeminiLiveLLMSettings

    # pipecat sets its default level on thinking models with model_copy(update=...), which skips
    # validation, so a plain "LOW" reaches google-genai's serializer and warns on every setup.
    _DEFAULT_THINKING_LEVEL = ThinkingLevel.LOW

    def __init__(
        self, *,
        # Ours (see the class docstring).
        store: SqlEventStore, call_id: str, policy: Policy | None = None,
        worker_id: str | None = None,
        speaking_signal: Literal["transport", "model"] = "transport",
        speaking_timeout_s: float = 4.0, snapshot_every: int = 500,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        reconnect_window_s: float = RECONNECT_WINDOW_S,
        tool_grace_s: float = TOOL_GRACE_S,
        playback_lead_s: float = PLAYBACK_LEAD_S,
        handed_over_at: float | None = None,
        caller_audio_hold_s: float = CALLER_AUDIO_HOLD_S,
        # pipecat's GeminiLiveLLMService, spelled out so that IDEs and type checkers see them
        # (their defaults are pipecat's: tests/service/test_pipecat_contract.py pins them).
        # `model`, `voice_id` and `params` are deprecated upstream in favour of `settings`.
        api_key: str,
        model: str | None = None,
        voice_id: str = "Charon",
        start_audio_paused: bool = False,
        start_video_paused: bool = False,
        system_instruction: str | None = None,
        tools: ToolsSchema | list[FunctionSchema | DirectFunction] | list[dict] | None = None,
        params: InputParams | None = None,
        settings: GeminiLiveLLMSettings | None = None,
        inference_on_context_initialization: bool = True,
        user_audio_preroll_secs: float | None = None,
        file_api_base_url: str = "https://generativelanguage.googleapis.com/v1beta/files",
        http_options: HttpOptions | dict[str, Any] | None = None,
        # The base services' own (run_in_parallel, function_call_timeout_secs, name, ...).
        **kwargs: Any):
        if speaking_signal not in ("transport", "model"):
            raise ValueError(f"speaking_signal must be 'transport' or 'model', not "
                             f"{speaking_signal!r}")
        check_seconds("speaking_timeout_s", speaking_timeout_s)
        check_seconds("reconnect_window_s", reconnect_window_s, zero_ok=True)
        check_count("max_frame_bytes", max_frame_bytes)
        check_seconds("tool_grace_s", tool_grace_s, zero_ok=True)
        check_seconds("playback_lead_s", playback_lead_s, zero_ok=True)
        check_seconds("caller_audio_hold_s", caller_audio_hold_s, zero_ok=True)
        super().__init__(
            api_key=api_key, model=model, voice_id=voice_id,
            start_audio_paused=start_audio_paused, start_video_paused=start_video_paused,
            system_instruction=system_instruction, tools=tools, params=params,
            settings=settings,
            inference_on_context_initialization=inference_on_context_initialization,
            user_audio_preroll_secs=user_audio_preroll_secs,
            file_api_base_url=file_api_base_url,
            http_options=_client_options(http_options, max_frame_bytes),
            **kwargs)
        self._max_frame_bytes = max_frame_bytes
        self._driver = CallDriver(store, call_id, policy, worker_id, snapshot_every)
        # The parts, each owning its state (see the module's docstring). Every commit and
        # what follows from it goes through the one step (step.py).
        self.stepper = Stepper(self._driver, self._spawn, self.on_fenced)
        self.log_writer = LogWriter(self._driver, self.stepper, self._spawn,
                                    label=f"{self}: call {call_id}")
        self.speech = SpeechTracker(speaking_signal, speaking_timeout_s)
        self.speech_log = SpeechLog(self._driver, self.log_writer, self.speech)
        self.setup_context = SetupContext(self, self.log_writer)
        handles = HandleGate(self._driver, self.log_writer)
        self.effects = EffectRunner(self, self.log_writer, self.speech, handles,
                                    self.setup_context, self.stepper)
        self.caller_audio = CallerAudioHold(caller_audio_hold_s, label=f"{self}: call {call_id}")
        self.receiver = Receiver(self, self.log_writer, self.speech, handles, self.effects,
                                 self.setup_context, self.caller_audio)
        self.results = ResultIntake(self, self.log_writer, self.effects, self.stepper)
        self.seeder = Seeder(self, self.effects, self.speech, handles, self.stepper)
        self.session_link = Link(self, self.log_writer, self.speech, self.seeder,
                                 self.receiver.flush_transcript, reconnect_window_s,
                                 self.caller_audio, self.receiver.forget_caller_words)
        self.stepper.effects = self.effects
        self.log_writer.effects = self.effects
        self.effects.link = self.session_link
        self._watchdog_task: asyncio.Task | None = None
        self.outcome_checks = OutcomeChecks(self._driver, self.log_writer, self.stepper)
        self._tool_grace_s = tool_grace_s
        self._playback_lead_s = playback_lead_s
        self._handed_over_us = None if handed_over_at is None else int(handed_over_at * 1e6)
        #: Where the caller's playback is (a playback.PlaybackPosition), if the pipeline knows:
        #: an interrupted turn is then logged as far as the caller heard it.
        self.playback: PlaybackPosition | None = None
        # For the app: the call cannot go on here (end it, close its stream). Each fires once.
        self._register_event_handler("on_connection_given_up")  # (service, error)
        self._register_event_handler("on_fenced")  # (service)
        self._told_fenced = False

    @staticmethod
    def warm_up(http_options: Any = None, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        """Pay the process's one-time costs of a call before its first call: the shared TLS
        context (the CA bundle parsed) and a google-genai client with the transports it
        imports, built as every call builds its own. A fresh worker's first calls would
        otherwise pay them on the event loop, a silence in every call already on it.
        Blocking: call it at startup, in a thread (the phone bot's lifespan does)."""
        Client(api_key="warm-up", http_options=_client_options(http_options, max_frame_bytes))

    # ------------------------------------------------------------------ public helpers
    @property
    def call_id(self) -> str:
        return self._driver.call_id

    @property
    def driver(self) -> CallDriver:
        return self._driver

    def idempotency_key(self, tool_call_id: str) -> str | None:
        """The key a tool handler should use to make a re-run after a crash harmless."""
        call = self._driver.state.calls.get(tool_call_id)
        return call.idempotency_key if call else None

    def register_outcome_check(self, name: str, check: OutcomeCheck, *,
                               rerun_if_not_done: bool = False,
                               timeout_s: float = CHECK_TIMEOUT_S) -> None:
        """Let a takeover ask, instead of guessing, whether a call of tool `name` a crash left
        in doubt took effect: `check(idempotency_key, args)` (plain or async) returns
        `Done(result)` (the model gets that result), `NotDone()` (answered as not done, or
        run again with the same key if `rerun_if_not_done`) or `CannotTell()` ("outcome
        unknown", as for a check that fails or takes longer than `timeout_s`)."""
        self.outcome_checks.register(name, check, rerun_if_not_done=rerun_if_not_done,
                                     timeout_s=timeout_s)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        """A task of the pipeline's task manager. Without one (a service used outside a
        pipeline) the coroutine is closed before the error goes on: left unscheduled, Python
        warns at exit that it was never awaited."""
        try:
            return self.create_task(coroutine, name)
        except BaseException:
            coroutine.close()
            raise

    @property
    def pipecat_state(self) -> PipecatState:
        """What our parts may change of pipecat's own attributes, as they are now."""
        return PipecatState(
            session=self._session, session_resumption_handle=self._session_resumption_handle,
            system_instruction_from_init=self._system_instruction_from_init,
            base_system_instruction=self._base_system_instruction,
            tools_from_init=self._tools_from_init, bot_is_responding=self._bot_is_responding,
            ready_for_realtime_input=self._ready_for_realtime_input,
            run_llm_when_session_ready=self._run_llm_when_session_ready,
            settings={key: getattr(self._settings, key, None) for key in RESTORED_SETTINGS})

    def apply(self, state: PipecatState) -> None:
        """The one place our code writes pipecat's private attributes: each that `state`
        changes (a part returned it; what it left as read is not written again)."""
        now = self.pipecat_state
        for f in dataclasses.fields(PipecatState):
            value = getattr(state, f.name)
            if f.name != "settings" and value is not getattr(now, f.name):
                setattr(self, f"_{f.name}", value)
        for key, value in state.settings.items():
            if value is not now.settings.get(key):
                setattr(self._settings, key, value)

    async def on_fenced(self) -> None:
        """A newer worker owns this call: stop talking to Gemini, write nothing more."""
        logger.error(f"{self}: call {self.call_id} was taken over by another worker; stopping")
        if observe.SINKS:
            observe.left(self._driver, "taken_over")
        if (self._session is not None or self._connection_task is not None) \
                and not self._disconnecting:
            self._spawn(self._disconnect(), "fenced_disconnect")
        if not self._told_fenced:
            self._told_fenced = True
            await self._call_event_handler("on_fenced")

    # ------------------------------------------------------------------ lifecycle
    # (pipecat's FrameProcessor narrows BaseObject.setup's argument itself: its override)
    async def setup(self, setup: FrameProcessorSetup):  # type: ignore[override]
        tracing.follow(self._driver, setup.tracing_context)  # (None: pipecat does not trace)
        try:
            state = await self._driver.attach(model=str(self._settings.model),
                                              tools=tool_names(self._tools_from_init),
                                              settings=settings_snapshot(self._settings))
        except CallClosed as exc:
            # Nothing to do for this worker: end its pipeline now. Raised alone, pipecat
            # reported it and then waited 20 s for a start that could not come.
            logger.error(f"{self}: {exc}; ending the pipeline")
            await super().setup(setup)
            await self.push_frame(CancelWorkerFrame(reason=str(exc)), FrameDirection.UPSTREAM)
            raise
        logger.info(f"{self}: call {self.call_id} attached at version {state.version}, "
                    f"epoch {self._driver.epoch}")
        self.apply(restored(self.pipecat_state, state.settings))
        # A dead worker's playback stopped with it: the bot's message it was playing is cut
        # to what the caller can have heard before the first session is chosen (heard.py).
        if state.takeovers:
            await self.log_writer.log(TakenOver(self._playback_lead_s, self._handed_over_us),
                                      when=When.DURABLE)
        # Calls a dead worker left in doubt are settled before the new session is seeded, so
        # the model learns their outcome with its history instead of asking again. (Re-runs
        # of idempotent ones wait for the pipeline's StartFrame: no tool runs before it.)
        await self.outcome_checks.settle()
        await self.effects.perform_due(frozenset({ResolveInDoubt}))
        # The first connection resumes from the newest handle the log allows (takeover).
        self.apply(dataclasses.replace(self.pipecat_state,
                                       session_resumption_handle=self._driver.resumption_handle()))
        await super().setup(setup)
        self._watchdog_task = self._spawn(watch_silence(
            self._driver, self.log_writer, self.speech, self.receiver), "speech_watchdog")

    async def stop(self, frame: EndFrame):
        self.log_writer.call_ending = True
        try:
            await self._driver.close("ended")
        except Exception as exc:  # noqa: BLE001 - shutting down: report, do not hang
            logger.error(f"{self}: could not record the end of call {self.call_id}: {exc}")
        # A tool the hang-up caught mid-run still logs its outcome, after the end.
        if not self._driver.fenced:  # (a fenced worker could not log the outcome)
            await wait_for_tools(self._function_call_tasks, self._tool_grace_s, str(self))
        await super().stop(frame)

    async def cleanup(self):
        self.log_writer.call_ending = True
        if self._watchdog_task:
            await self.cancel_task(self._watchdog_task)
            self._watchdog_task = None
        await self.log_writer.drain(self.cancel_task)
        if observe.SINKS:  # (a call this worker no longer serves, if it still counts)
            observe.left(self._driver, "taken_over" if self._driver.fenced else "stopped")
        await super().cleanup()

    def _tag_tool_behaviors(self, tools: list) -> None:
        super()._tag_tool_behaviors(tools)
        self.setup_context.read_declared(tools)

    # ------------------------------------------------------------------ server messages
    async def _handle_server_message(self, message):
        # A session that delivered a message is progress. pipecat resets its failure count
        # only after 10 s on one connection, so three sessions each closed right after a
        # toolCall (seen in the hostile-wire fuzz) gave the service up, results undelivered.
        # The log counts failures in a row the same way (SessionLeft.heard), and decides.
        self._consecutive_failures = 0
        self.session_link.heard = True  # (the log's count ends at such a session: decide)
        try:
            await self.receiver.message(message)
        except Exception as exc:  # noqa: BLE001 - our bookkeeping must not count as a socket error
            logger.exception(f"{self}: failed to record a server message: {exc}")
        try:
            await super()._handle_server_message(message)
        except Exception as exc:  # noqa: BLE001 - a message pipecat chokes on is not a socket error
            # It would count as one (reconnect, and the service given up after three): log it
            # and let the log resync the session like any message we could not take in.
            logger.exception(f"{self}: pipecat failed on a server message: {exc}")
            fields = sorted(k for k, v in message if v is not None)
            await self.log_writer.log(ServerMessageRejected("message_handling_failed", {
                "fields": fields, "error": f"{type(exc).__name__}: {str(exc)[:200]}"},
                self._driver.state.generation))
        sc = message.server_content
        if sc and sc.turn_complete:
            await self.receiver.flush_transcript()
            if self.speech.signal == "model":  # noted: the receive loop must not wait
                await self.speech_log.stopped("turn_complete")

    async def _handle_msg_tool_call(self, message):
        await self.receiver.tool_call(message)

    # ------------------------------------------------------------------ speech
    async def _set_bot_is_responding(self, responding: bool):
        if responding and not self._bot_is_responding:
            self.speech.turn_began()
        await super()._set_bot_is_responding(responding)
        if responding:
            await self.speech_log.model_responding()

    async def process_frame(self, frame, direction: FrameDirection):
        if isinstance(frame, LLMSetToolsFrame):
            # pipecat ignores it for Gemini Live; the log takes it like a settings change
            # (a contextUpdate where the model takes one, else a new session).
            await self.setup_context.set_tools(frame.tools)
            return
        if isinstance(frame, InterruptionFrame):
            # Before pipecat passes it on (PlaybackMarks starts a new turn at it): where the
            # playback it stops was.
            await self.receiver.pipeline_interruption()
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            # Calls a takeover must run (re-runs of idempotent ones in doubt, calls asked for
            # and never started) start now that the pipeline has, while the Gemini handshake
            # goes on: waiting for the session had the model wait that much longer for them.
            self._spawn(self.effects.perform_due(STARTS), "takeover_starts")
            return
        if isinstance(frame, InterruptionFrame):  # e.g. a local VAD barge-in, either way
            self.speech.interrupted()  # the transport drops what was queued
            self.caller_audio.caller_interrupted()
            return
        if direction == FrameDirection.UPSTREAM:
            await self.speech_log.transport_frame(frame)

    # ------------------------------------------------------------------ the caller's audio
    async def _send_user_audio(self, frame):
        if self._audio_input_paused or self._vad_disabled:
            # Paused: pipecat drops it, the hold waits. Local turn detection: pipecat sends
            # audio only inside an activity window it opened on the old session.
            await super()._send_user_audio(frame)
            return
        if not self._takes_audio():
            if self._holds_audio():
                self.caller_audio.hold(frame)  # for the next session (caller_audio.py)
            else:
                self.caller_audio.discard()
            return
        chunks = [*self.caller_audio.release(), frame]
        for i, chunk in enumerate(chunks):
            if not self._takes_audio():  # the session went while the held audio went out
                if self._holds_audio():
                    self.caller_audio.hold_again(chunks[i:])
                return
            await super()._send_user_audio(chunk)
            self.caller_audio.sent(chunk)

    def _takes_audio(self) -> bool:
        return (self._session is not None and self._ready_for_realtime_input
                and not self._disconnecting)

    def _holds_audio(self) -> bool:
        """Will a session come for this call's audio (not ended, given up or taken over)?"""
        state = self._driver.state
        return (bool(self.caller_audio.limit_s) and not self._told_fenced
                and not self._driver.fenced and not state.closed and not state.given_up)

    # ------------------------------------------------------------------ settings
    async def _update_settings(self, delta):
        changed = await super()._update_settings(delta)
        if changed:
            await self.setup_context.settings_changed(changed)
        return changed

    # ------------------------------------------------------------------ the session
    async def _connect(self, session_resumption_handle: str | None = None):
        if self._session or self._driver.fenced or not self._driver.epoch:
            return  # (epoch 0: not attached, as a call that ended: no session for it)
        # pipecat's setup() connects with no handle: use the one the log chose (setup and
        # the link set it, None for a fresh session: upstream also stores every handle a
        # session issues there, which the log may have ruled out).
        handle = self.session_link.handle_for(session_resumption_handle
                                              or self._session_resumption_handle)
        # None means a fresh session, seeded.
        self.apply(dataclasses.replace(self.pipecat_state, session_resumption_handle=handle))
        await super()._connect(session_resumption_handle=handle)

    async def _connection_task_handler(self, config):
        try:
            await super()._connection_task_handler(config)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a handshake failure: upstream leaves the service dead
            if self._disconnecting:
                return
            logger.warning(f"{self}: connection failed before setupComplete: {exc}")
            await self.session_link.handshake_failed(exc)

    async def _handle_connection_error(self, error: Exception) -> bool:
        await self.session_link.lost(error)  # (from the receive loop; handshakes: logged)
        # Giving up is the log's decision (decide.gives_up, over the failures in a row it
        # holds): pipecat's count is set so that upstream agrees, and pushes its ErrorFrame.
        self._consecutive_failures = (MAX_CONSECUTIVE_FAILURES - 1 if self.session_link.given_up
                                      else 0)
        go_on = await super()._handle_connection_error(error)
        if not go_on:
            await self._call_event_handler("on_connection_given_up", error)
        return go_on

    async def _handle_session_ready(self, session):
        # Before upstream's receive loop starts: frames the SDK cannot parse are reported
        # and skipped instead of failing the loop (service/wire.py).
        guard_session(session, self.receiver.rejected, self._max_frame_bytes)
        if not await self.session_link.session_ready():
            # Fenced (or the call is ending): pipecat has not made it `_session` yet, so
            # nothing else would close it, and its receive loop would feed this pipeline.
            await session.close()
            return
        if self.session_link.connecting_handle is not None:
            # Resumed: it holds all it was told from the start, whenever pipecat asks for its
            # seed (decided on the log: session_store.seeding).
            self.log_writer.along(SeedAsked(self._driver.state.generation))
        self.apply(dataclasses.replace(self.pipecat_state, bot_is_responding=False))
        self.speech.session_ready()
        await super()._handle_session_ready(session)
        await self.effects.perform_due()

    async def _reconnect(self):
        # Upstream calls this on a receive error; route it through the log's choice of handle.
        # From its receive loop, in a task of its own: run inside the connection task, the
        # reconnect's own logging could be cancelled mid-append by a _disconnect of that
        # task (seen with a 1009 close: a second reconnect raced it, two sessions opened).
        if asyncio.current_task() is self._connection_task:
            self.session_link.schedule("error")
            return
        await self.session_link.reconnect_now("error")

    async def _create_initial_response(self, for_reconnect: bool = False):
        await self.seeder.seed(for_reconnect)

    # ------------------------------------------------------------------ tool calls
    async def _run_function_call(self, runner_item):
        # Where pipecat really runs a tool: a call queued behind another (run_in_parallel=
        # False) has no task for a cancellation to stop until its turn comes.
        if self.effects.cancelled(runner_item.tool_call_id):
            logger.info(f"{self}: {runner_item.tool_call_id} not run: Gemini cancelled it")
            return
        await super()._run_function_call(runner_item)

    async def _handle_function_call_result(self, frame: FunctionCallResultFrame):
        await self.results.result(frame)

    async def push_frame(self, frame, direction: FrameDirection = FrameDirection.DOWNSTREAM):
        # (pipecat broadcasts a cancelled call both ways: the downstream copy is the one.)
        if direction == FrameDirection.DOWNSTREAM and isinstance(frame, FunctionCallCancelFrame):
            await self.results.stopped(frame.tool_call_id)
        await super().push_frame(frame, direction)

    async def _handle_interruptions(self, _) -> None:
        # pipecat cancels every running call of a tool registered with
        # cancel_on_interruption (the default) on any interruption, local or Gemini's, and
        # answers none of them: Gemini, which still holds the id unless it cancels it
        # itself, waits for ever. Gemini decides: its toolCallCancellation stops a logged
        # call (see the receiver); otherwise the call finishes and is answered.
        return None

    async def _tool_result(self, tool_call_id, tool_name, tool_result_message, *, is_final=True,
                           spoken=True):
        # Results leave only by the delivery rules (EffectRunner.deliver). Upstream would
        # send them from push_frame and again from every context re-scan.
        return None

    async def _process_completed_function_calls(self, send_new_results: bool):
        await super()._process_completed_function_calls(send_new_results=False)
