"""DurableGeminiLiveLLMService: pipecat's Gemini Live service, driven by the call's event log.

The subclass is a thin shell. It reports what it observes (tool calls, speech, settings,
handles, goAway, cancellations, results) to the CallDriver, which appends the facts and the
decisions to the log before anything acts on them; then it performs whatever `due()` says is
due now: start calls, resolve in-doubt calls, send results by the delivery rules, reconnect.
Startup after a crash is the same path: attach (new fencing epoch), connect with the handle
the log allows, and perform what is due.

Every private pipecat hook this file overrides or reads is pinned by
tests/service/test_pipecat_contract.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from typing import Any, Literal

from google.genai.types import Content, FunctionResponse, Part
from loguru import logger
from websockets.exceptions import ConnectionClosed
from pipecat.adapters.llm.services.gemini_adapter import GeminiLLMAdapter
from pipecat.frames.frames import (BotStartedSpeakingFrame, BotStoppedSpeakingFrame, EndFrame,
                                   FunctionCallFromLLM, FunctionCallResultFrame,
                                   InterruptionFrame)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from session_store import Policy
from session_store import events as ev
from session_store.decide import (OUTCOME_UNKNOWN, CancellationArrived, FunctionCall, GoAway,
                                  InterruptionObserved, Reconnect, ResolveInDoubt, SendResult,
                                  SettingsUpdate, SpeechStarted, SpeechStopped, StartCall,
                                  ToolCallsArrived, due, result_as_content, result_value,
                                  seed_history)
from session_store.errors import Fenced
from session_store.storage import SqlEventStore

from .driver import CallDriver, now_us
from .redaction import redact_settings

# Settings restored from the log on takeover (plain strings; secrets were never logged).
RESTORED_SETTINGS = ("system_instruction", "voice", "language")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*s?\s*$")


def parse_time_left(value: Any) -> float:
    """goAway.timeLeft arrives as a protobuf Duration string such as "3s" (or "1.5s")."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "total_seconds"):
        return float(value.total_seconds())
    match = _DURATION.match(str(value))
    return float(match.group(1)) if match else 0.0


def _jsonable(value: Any) -> Any:
    """A tool result as plain JSON (what the log stores and the model is told)."""
    return json.loads(json.dumps(value, default=str))


class DurableGeminiLiveLLMService(GeminiLiveLLMService):
    """Drop-in GeminiLiveLLMService whose behaviour is decided from a durable event log.

    Extra arguments: `store` (from `session_store.open_store`), `call_id` (the stream; an
    existing open call is taken over), `policy` (deferral, idempotent tools, reuse of
    re-issued calls), `worker_id`, `speaking_signal` ("transport": the bot speaks from the
    first model audio until the output transport's BotStoppedSpeakingFrame; "model": until
    turnComplete, for pipelines without an output transport) and `speaking_timeout_s` (a
    safety net: with no model output and no transport signal for that long the bot counts as
    silent, so a server that holds turnComplete until it gets a tool response cannot
    deadlock the call).
    """

    def __init__(self, *args, store: SqlEventStore, call_id: str, policy: Policy | None = None,
                 worker_id: str | None = None,
                 speaking_signal: Literal["transport", "model"] = "transport",
                 speaking_timeout_s: float = 4.0, **kwargs):
        super().__init__(*args, **kwargs)
        self._driver = CallDriver(store, call_id, policy, worker_id)
        self._speaking_signal = speaking_signal
        self._speaking_timeout_s = speaking_timeout_s
        self._last_speech_activity = 0.0
        self._connecting_handle: str | None = None
        self._bad_handles: set[str] = set()
        self._due_lock = asyncio.Lock()
        self._seeded_generation = 0
        self._reconnect_task: asyncio.Task | None = None
        self._notes_task: asyncio.Task | None = None
        self._watchdog_task: asyncio.Task | None = None
        # The output transport's own view: between its BotStarted and BotStoppedSpeakingFrame.
        self._transport_speaking = False
        # Model turns with output begun, and how many of them the transport finished playing:
        # a transport stop ends the bot's speech only once it has played every turn begun.
        self._model_turns = 0
        self._turns_played = 0
        self._transcript: dict[str, list[str]] = {"user": [], "assistant": []}

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

    # ------------------------------------------------------------------ lifecycle
    async def setup(self, setup: FrameProcessorSetup):
        state = await self._driver.attach(model=str(self._settings.model),
                                          tools=self._tool_names(),
                                          settings=self._settings_snapshot())
        logger.info(f"{self}: call {self.call_id} attached at version {state.version}, "
                    f"epoch {self._driver.epoch}")
        # A takeover continues with the settings the log says are current, not the ones this
        # worker was constructed with (the app may have changed the prompt before the crash).
        for key in RESTORED_SETTINGS:
            if isinstance(state.settings.get(key), str):
                setattr(self._settings, key, state.settings[key])
        if isinstance(state.settings.get("system_instruction"), str):
            self._system_instruction_from_init = state.settings["system_instruction"]
        # Calls a dead worker left in doubt are settled before the new session is seeded, so
        # the model learns their outcome with its history instead of asking again. (Re-runs
        # of idempotent ones wait for the pipeline: no tool runs before it has started.)
        await self._perform_due(lambda e: isinstance(e, ResolveInDoubt))
        # The first connection resumes from the newest handle the log allows (takeover).
        self._session_resumption_handle = self._driver.resumption_handle()
        await super().setup(setup)
        self._watchdog_task = self.create_task(self._speech_watchdog(), "speech_watchdog")

    async def stop(self, frame: EndFrame):
        await self._close_call("ended")
        await super().stop(frame)

    async def cleanup(self):
        if self._watchdog_task:
            await self.cancel_task(self._watchdog_task)
            self._watchdog_task = None
        await super().cleanup()

    async def _close_call(self, reason: str) -> None:
        if self._driver.fenced or self._driver.state.closed:
            return
        try:
            events: list[ev.Event] = []
            if self._driver.state.connected:
                events.append(ev.Disconnected(self._driver.state.generation, "shutdown"))
            events.append(ev.SessionClosed(reason))
            await self._driver.record(*events)
        except Exception as exc:  # noqa: BLE001 - shutting down: report, do not hang
            logger.error(f"{self}: could not record the end of call {self.call_id}: {exc}")

    def _tool_names(self) -> list[str]:
        tools = self._tools_from_init
        standard = getattr(tools, "standard_tools", None) or []
        return sorted(getattr(t, "name", str(t)) for t in standard)

    def _settings_snapshot(self) -> dict[str, Any]:
        values = {}
        for key in ("model", "system_instruction", "voice", "language", "modalities"):
            value = getattr(self._settings, key, None)
            if value is not None and type(value).__name__ != "NotGiven":
                values[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
        return redact_settings(values)

    # ------------------------------------------------------------------ connection
    async def _connect(self, session_resumption_handle: str | None = None):
        if self._session:
            return
        # pipecat's setup() connects with no handle: use the one the log chose.
        handle = session_resumption_handle or self._session_resumption_handle
        self._connecting_handle = handle
        self._session_resumption_handle = handle  # None means a fresh session, seeded below
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
            handle = self._connecting_handle
            if handle:
                self._bad_handles.add(handle)  # next try: an older handle or a fresh session
            await self._record_quietly(ev.AnomalyRecorded(
                "handshake_failed", {"handle": handle, "error": str(exc)[:500]},
                self._driver.state.generation))
            if await self._handle_connection_error(exc):
                await asyncio.sleep(0.2 * self._consecutive_failures)
                self._session = None
                await self._reconnect_now("handshake_failed")

    async def _handle_session_ready(self, session):
        state = self._driver.state
        await self._driver.record(ev.Connected(
            state.generation + 1, self._connecting_handle,
            hashlib.sha256(str(self._system_instruction_from_init or "").encode()).hexdigest()))
        if self._transport_speaking:
            # A new session resets "speaking" in the projection, but the transport may still be
            # playing the old session's audio (a reconnect that could not wait for the turn
            # to end): deferred calls keep waiting for the transport to stop.
            await self._driver.observe(SpeechStarted(self._driver.state.generation, "transport"))
        self._bot_is_responding = False
        await super()._handle_session_ready(session)
        await self._perform_due()

    async def _reconnect(self):
        # Upstream calls this on a receive error; route it through the log's choice of handle.
        await self._reconnect_now("error")

    async def _reconnect_now(self, reason: str) -> None:
        await self._flush_transcript()  # what was said belongs to the session that heard it
        state = self._driver.state
        if state.connected:
            events: list[ev.Event] = [ev.Disconnected(state.generation, reason)]
            if self._transport_speaking:
                # The projection takes a disconnect as the end of speech, but the transport
                # is still playing what the old session sent (a reconnect that could not wait
                # for the turn, e.g. a goAway deadline): deferred calls keep waiting for it.
                events.append(ev.BotStartedSpeaking(state.generation, "transport"))
            await self._record_quietly(*events)
        # A new session must carry the settings as they are now (upstream sends the old prompt).
        if self._settings.system_instruction is not None:
            self._system_instruction_from_init = self._settings.system_instruction
        await self._disconnect()
        self._bot_is_responding = False
        if self._driver.fenced or state.closed:
            return
        handle = self._driver.resumption_handle(exclude=self._bad_handles)
        await self._connect(session_resumption_handle=handle)

    def _schedule_reconnect(self, reason: str) -> None:
        """Reconnect in a task of its own: never from inside the receive loop."""
        if self._reconnect_task and not self._reconnect_task.done():
            return
        self._reconnect_task = self.create_task(self._reconnect_now(reason), "planned_reconnect")

    def _link_busy(self) -> bool:
        reconnecting = self._reconnect_task is not None and not self._reconnect_task.done()
        handshaking = self._session is None and self._connection_task is not None
        return reconnecting or handshaking or self._awaiting_seed()

    def _awaiting_seed(self) -> bool:
        """A fresh session takes no result on its own before its seed: the seed carries every
        result the log has, so one sent just before it reaches the model twice. (Seen in the
        crash harness: a takeover worker's first session is ready before the pipeline's
        first context, so pipecat seeds only later; a result sent as content in between was
        then seeded again.) The seed comes with the first context frame at the latest."""
        state = self._driver.state
        current = state.generations.get(state.generation)
        return (current is not None and current.handle is None
                and self._seeded_generation != state.generation)

    # ------------------------------------------------------------------ seeding
    async def _create_initial_response(self, for_reconnect: bool = False):
        """Seed a fresh session from the log (upstream seeds from the pipecat context)."""
        # Under the effects lock: a seed is a send of results, and no other task may decide
        # to send the same results while it is under way (found by the crash harness).
        async with self._due_lock:
            await self._seed(for_reconnect)
        await self._perform_due()  # results held back until the seed (_awaiting_seed)

    async def _seed(self, for_reconnect: bool) -> None:
        if self._disconnecting:
            return
        if not self._session:
            self._run_llm_when_session_ready = True
            return
        await self._log_initial_context()
        state = self._driver.state
        if self._seeded_generation == state.generation:
            # pipecat asks again (first context after session ready): one seed per session,
            # or every result in it would reach the model twice.
            return
        self._seeded_generation = state.generation
        current = state.generations.get(state.generation)
        if current is not None and current.handle is not None:
            # A resumed session already holds its history: seeding it again would put every
            # earlier result into the model twice (upstream does, on its first context).
            self._ready_for_realtime_input = True
            return
        turns = seed_history(state)
        if not turns:
            self._ready_for_realtime_input = True
            return
        seeded = [c for c in state.calls.values()
                  if c.has_outcome and not (state.in_model(c))]
        new_results = [c for c in seeded if not any(s.confirmed for s in c.sends)]
        trigger = (bool(new_results) or (not for_reconnect and self._inference_on_context_initialization)
                   or (for_reconnect and not self._is_gemini_3))
        contents = [Content(role="user" if role == "user" else "model", parts=[Part(text=text)])
                    for role, text in turns]
        if not self._is_gemini_3 and contents[-1].role != "user":
            contents.append(Content(role="user", parts=[Part(text=" ")]))
        generation = state.generation
        if seeded:
            await self._driver.record(*(ev.ToolResultSending(c.call_id, generation, "seed")
                                        for c in seeded))
        try:
            await self._session.send_client_content(turns=contents, turn_complete=trigger)
            if self._is_gemini_3 and trigger:
                await self._session.send_realtime_input(text=" ")
        except Exception as exc:  # noqa: BLE001 - the seed stays unconfirmed: resent next time
            logger.warning(f"{self}: seeding failed: {exc}")
            self._after_send_failure(exc)
            return
        if seeded:
            await self._driver.record(*(ev.ToolResultSent(c.call_id, generation, "seed")
                                        for c in seeded))
        self._ready_for_realtime_input = True

    async def _log_initial_context(self) -> None:
        """Log the pipecat context's opening messages once, so any worker can seed from them."""
        if self._context is None or any(r != "tool" for r, _ in self._driver.state.conversation):
            return
        events = []
        for message in self._context.get_messages():
            role = message.get("role") if isinstance(message, dict) else None
            text = _message_text(message) if role in ("user", "developer", "assistant") else None
            if text:
                events.append(ev.ConversationMessage("assistant" if role == "assistant" else "user",
                                                     text, self._driver.state.generation))
        if events:
            await self._driver.record(*events)

    # ------------------------------------------------------------------ server messages
    async def _handle_server_message(self, message):
        try:
            await self._observe_server_message(message)
        except Fenced:
            await self._on_fenced()
            return
        except Exception as exc:  # noqa: BLE001 - our bookkeeping must not count as a socket error
            logger.exception(f"{self}: failed to record a server message: {exc}")
        await super()._handle_server_message(message)
        sc = message.server_content
        if sc and sc.turn_complete:
            await self._flush_transcript()
            if self._speaking_signal == "model":
                await self._observe(SpeechStopped(self._driver.state.generation, "turn_complete"))

    async def _observe_server_message(self, message) -> None:
        gen = self._driver.state.generation
        update = message.session_resumption_update
        if update and update.resumable and update.new_handle:
            # Logged in order, without holding up the receive loop (and the audio behind it).
            self._note(ev.HandleIssued(gen, update.new_handle,
                                       update.last_consumed_client_message_index))
        if message.go_away is not None:
            time_left = parse_time_left(message.go_away.time_left)
            await self._observe(GoAway(gen, time_left))
            margin = self._driver.policy.go_away_margin_s
            self.create_task(self._due_after(max(time_left - margin, 0.0)), "go_away_deadline")
        if message.tool_call_cancellation is not None:
            ids = tuple(message.tool_call_cancellation.ids or ())
            before = {i: self._driver.state.calls[i].status for i in ids
                      if i in self._driver.state.calls}
            await self._observe(CancellationArrived(ids, gen))
            for call_id, status in before.items():
                if status == "started":  # already running: stop it if pipecat can
                    await self._cancel_function_calls_by_tool_call_id(call_id)
        sc = message.server_content
        if sc is None:
            return
        if sc.interrupted:
            self._turns_played = self._model_turns  # the transport drops the queued audio
            await self._observe(InterruptionObserved(gen))
        if sc.model_turn:
            self._last_speech_activity = time.monotonic()
        if sc.input_transcription and sc.input_transcription.text:
            self._transcript["user"].append(sc.input_transcription.text)
        if sc.output_transcription and sc.output_transcription.text:
            self._transcript["assistant"].append(sc.output_transcription.text)

    async def _flush_transcript(self) -> None:
        events = []
        for role in ("user", "assistant"):
            text = "".join(self._transcript[role]).strip()
            self._transcript[role].clear()
            if text:
                events.append(ev.ConversationMessage(role, text, self._driver.state.generation))
        for event in events:
            self._note(event)

    async def _due_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._perform_due()

    # ------------------------------------------------------------------ tool calls
    async def _handle_msg_tool_call(self, message):
        calls = tuple(
            # Vertex sends no ids: make one, as upstream does, and persist it with the call.
            FunctionCall(f.id or f"gen{self._driver.state.generation}-{uuid.uuid4()}", f.name,
                         _jsonable(f.args or {}))
            for f in (message.tool_call.function_calls or []))
        if calls:
            # Decided and logged (with the start of every call now due: one commit) by the
            # note flush, in order with everything else: audio behind the toolCall is not
            # held up by the log.
            self._note(ToolCallsArrived(calls, self._driver.state.generation))

    async def _handle_function_call_result(self, frame: FunctionCallResultFrame):
        is_final = frame.properties.is_final if frame.properties else True
        if not is_final:
            return  # one result per call: intermediate results are not part of the protocol here
        call = self._driver.state.calls.get(frame.tool_call_id)
        try:
            if call is None:
                await self._driver.record(ev.AnomalyRecorded(
                    "result_for_unknown_call", {"call_id": frame.tool_call_id,
                                                "name": frame.function_name}))
            elif call.has_outcome:
                await self._driver.record(ev.AnomalyRecorded(
                    "second_result", {"call_id": call.call_id, "name": call.name}))
            else:
                # The result and the intent to send it (if it can go now): one commit.
                async with self._due_lock:
                    sending = await self._driver.record(
                        ev.ToolCallCompleted(call.call_id, _jsonable(frame.result)),
                        then=self._sends_now)
                    await self._deliver([e for e in sending
                                         if isinstance(e, ev.ToolResultSending)])
        except Fenced:
            await self._on_fenced()
            return
        await self._perform_due()

    async def _tool_result(self, tool_call_id, tool_name, tool_result_message, *, is_final=True,
                           spoken=True):
        # Results leave only through _send_result, by the delivery rules. Upstream would
        # send them from push_frame and again from every context re-scan.
        return None

    async def _process_completed_function_calls(self, send_new_results: bool):
        await super()._process_completed_function_calls(send_new_results=False)

    # ------------------------------------------------------------------ speech
    async def _set_bot_is_responding(self, responding: bool):
        if responding and not self._bot_is_responding:
            self._model_turns += 1
        await super()._set_bot_is_responding(responding)
        if responding:
            self._last_speech_activity = time.monotonic()
            # Upstream calls this right before pushing a turn's first audio frame: note it
            # (logged before anything decided after it) rather than wait for a commit here.
            self._note(SpeechStarted(self._driver.state.generation, "model"))

    async def process_frame(self, frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame):  # e.g. a local VAD barge-in, either way
            self._turns_played = self._model_turns  # the transport drops what was queued
            return
        if direction != FrameDirection.UPSTREAM:
            return
        if isinstance(frame, BotStartedSpeakingFrame):
            self._transport_speaking = True
            self._last_speech_activity = time.monotonic()
            await self._observe(SpeechStarted(self._driver.state.generation, "transport"))
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self._transport_speaking = False
            # Gemini streams faster than real time: when a turn's playback ends (its
            # TTSStoppedFrame), the next turn's audio may already be queued behind it, and the
            # transport starts again at once. That stop is not silence (seen on the wire: it
            # let a goAway reconnect cut the next turn). A stop without a turnComplete (the
            # transport's silence fallback while 3.x holds turnComplete) ends the current
            # turn, so it counts too: no deadlock.
            self._turns_played = min(self._turns_played + 1, self._model_turns)
            if self._turns_played >= self._model_turns:
                await self._observe(SpeechStopped(self._driver.state.generation, "transport"))

    async def _speech_watchdog(self) -> None:
        """Silence safety net for speech the transport never reported (no output transport,
        text-only turns). While the transport is playing it is not silence: Gemini sends audio
        faster than real time, so the last chunk can arrive seconds before playback ends (seen
        on the wire: a deferred call started 1.4 s before the audio finished). The transport
        itself always ends its stretch (TTSStoppedFrame, or its own 3 s fallback)."""
        while True:
            await asyncio.sleep(0.25)
            silent_for = time.monotonic() - self._last_speech_activity
            if (self._driver.state.bot_speaking and not self._transport_speaking
                    and silent_for > self._speaking_timeout_s):
                await self._observe(SpeechStopped(self._driver.state.generation, "timeout"))

    # ------------------------------------------------------------------ settings
    async def _update_settings(self, delta):
        changed = await super()._update_settings(delta)
        if changed:
            keys = tuple(sorted(changed))
            values = redact_settings({k: _plain(getattr(self._settings, k, None)) for k in keys})
            # Nothing in a Gemini Live setup applies to a running session: every change
            # needs a new one (buffered while the bot speaks).
            await self._observe(SettingsUpdate(keys, values, needs_reconnect=True))
        return changed

    # ------------------------------------------------------------------ decide and act
    async def _observe(self, obs) -> None:
        try:
            # The observation and the calls it lets start: one commit, then they run. (No
            # effects lock: the driver's lock makes the start decision and its record one
            # step, so no other task can start the same call; and a note must not wait
            # behind a seed or a send.)
            started = await self._driver.observe(obs, then=self._starts_now)
            await self._run_started(started)
        except Fenced:
            await self._on_fenced()
            return
        await self._perform_due()

    def _note(self, item) -> None:
        """Log a fact in order without waiting for it; a task appends it (with the calls it
        lets start) unless another append takes it along first."""
        self._driver.note(item)
        if self._notes_task is None or self._notes_task.done():
            self._notes_task = self.create_task(self._flush_notes(), "log_notes")

    async def _flush_notes(self) -> None:
        try:
            while self._driver.has_notes:
                started = await self._driver.flush(then=self._starts_now)
                await self._run_started(started)
            await self._perform_due()
        except Fenced:
            await self._on_fenced()
        except Exception as exc:  # noqa: BLE001 - a task: report, the next append retries
            logger.exception(f"{self}: could not log {exc}")

    def _starts_now(self, state) -> list[ev.Event]:
        """"Started" for every call due to start now (decided on the state being committed)."""
        return [ev.ToolCallStarted(e.call_id, e.attempt, e.idempotency_key, self._driver.epoch)
                for e in due(state, self._driver.policy, now_us()) if isinstance(e, StartCall)]

    def _sends_now(self, state) -> list[ev.Event]:
        """The intent to send every result due now, if the link can carry it now."""
        if self._session is None or self._disconnecting or self._link_busy():
            return []
        return [ev.ToolResultSending(e.call_id, state.generation, e.via)
                for e in due(state, self._driver.policy, now_us()) if isinstance(e, SendResult)]

    async def _run_started(self, events: list[ev.Event]) -> None:
        """Run the calls whose start was just committed (write-ahead: never before)."""
        calls = [self._driver.state.calls[e.call_id] for e in events
                 if isinstance(e, ev.ToolCallStarted)]
        for call in calls:
            await self.run_function_calls([FunctionCallFromLLM(
                function_name=call.name, tool_call_id=call.call_id, arguments=call.args,
                context=self._context)])

    async def _perform_due(self, only=None) -> None:
        """Do what the log says is due now (or the part `only` selects), until nothing is."""
        async with self._due_lock:
            for _ in range(100):
                effects = [e for e in self._driver.due() if only is None or only(e)]
                try:
                    acted = await self._perform(effects)
                except Fenced:
                    await self._on_fenced()
                    return
                if not acted:
                    return

    async def _perform(self, effects: list) -> bool:
        """Perform one round of effects; starts and sends go in one commit each."""
        acted = False
        resolve = [e for e in effects if isinstance(e, ResolveInDoubt)]
        if resolve:
            await self._driver.record(*(ev.ToolCallFailed(e.call_id, OUTCOME_UNKNOWN,
                                                          outcome_unknown=True) for e in resolve))
            acted = True
        starts = {e.call_id for e in effects if isinstance(e, StartCall)}
        if starts:
            # Decided again under the driver's lock, with the record: an observation may
            # have started some of them meanwhile (it does not take the effects lock).
            await self._run_started(await self._driver.record(
                then=lambda state: [e for e in self._starts_now(state) if e.call_id in starts]))
            acted = True
        sends = [e for e in effects if isinstance(e, SendResult)]
        if sends and not (self._session is None or self._disconnecting or self._link_busy()):
            generation = self._driver.state.generation
            sending = await self._driver.record(*(
                ev.ToolResultSending(e.call_id, generation, e.via) for e in sends))
            acted |= await self._deliver(sending)
        for effect in effects:
            if isinstance(effect, Reconnect) and not self._link_busy():
                self._schedule_reconnect(effect.reason)
        return acted

    async def _deliver(self, sending: list[ev.Event]) -> bool:
        """Send results whose intent was just committed; confirm those that went out."""
        sent = []
        for intent in sending:
            call = self._driver.state.calls[intent.call_id]
            if await self._send_result(call, intent.via):
                sent.append(ev.ToolResultSent(call.call_id, intent.generation, intent.via))
        if sent:
            await self._driver.record(*sent)
        return bool(sent)

    async def _send_result(self, call, via: str) -> bool:
        try:
            if via == "tool_response":
                response = GeminiLLMAdapter.to_function_response_dict(
                    json.dumps(result_value(call), ensure_ascii=False))
                await self._session.send_tool_response(function_responses=[FunctionResponse(
                    id=call.call_id, name=call.name, response=response)])
            else:
                await self._session.send_client_content(
                    turns=[Content(role="user", parts=[Part(text=result_as_content(call))])],
                    turn_complete=True)
                if self._is_gemini_3:
                    await self._session.send_realtime_input(text=" ")
        except Exception as exc:  # noqa: BLE001 - unconfirmed: the next session resends it
            logger.warning(f"{self}: sending the result of {call.call_id} failed: {exc}")
            self._after_send_failure(exc)
            return False
        return True

    def _after_send_failure(self, exc: Exception) -> None:
        """A send failed. If the socket is closed, leave the reconnect to the receive loop:
        it still holds what the server sent before closing (a toolCall, a handle, ...) and
        raises on the close only after handing all of it over. Reconnecting from here would
        cancel the loop and silently lose those messages (seen on the wire: a toolCall right
        before a 1011 close vanished, and its handle with it). Any other send failure leaves
        a live socket we cannot trust: replace the session."""
        if isinstance(exc, ConnectionClosed) and self._connection_task is not None \
                and not self._connection_task.done():
            return
        self._schedule_reconnect("send_failed")

    async def _record_quietly(self, *events: ev.Event) -> None:
        try:
            await self._driver.record(*events)
        except Fenced:
            await self._on_fenced()

    async def _on_fenced(self) -> None:
        """A newer worker owns this call: stop talking to Gemini, write nothing more."""
        logger.error(f"{self}: call {self.call_id} was taken over by another worker; stopping")
        if self._session is not None and not self._disconnecting:
            self.create_task(self._disconnect(), "fenced_disconnect")


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if type(value).__name__ == "NotGiven":
        return None
    return str(value)


def _message_text(message: dict) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return content.strip() or None
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return " ".join(t for t in texts if t).strip() or None
    return None
