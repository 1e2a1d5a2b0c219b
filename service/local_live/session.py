"""One live connection: runs its script and answers the client, step by step.

The reader (:mod:`.intake`) records and judges every client frame synchronously;
this class only *sends*: the script's steps, then a reply each time a trigger fires.
All sends of a connection go through one queue, so a reply never interleaves with the
script's audio. On a thinking profile it also says how busy the model is: every
``serverContent`` sent during a model turn or while a call is open carries
``interactionStatus: IN_PROGRESS``, and ``IDLE`` follows once nothing is under way.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from . import protocol
from .profiles import Profile
from .model_state import ConversationEntry
from .record import Connection, HandleRecord, SentMessage
from .script import (
    DROP_SETUP,
    Audio,
    CancelToolCalls,
    Close,
    Dynamic,
    Drop,
    GoAway,
    InputTranscript,
    InteractionStatus,
    Interrupted,
    OutputTranscript,
    Raw,
    ResumptionUpdate,
    Script,
    Sleep,
    Step,
    ToolCall,
    TurnComplete,
    Usage,
    WaitFor,
    WaitIntermediate,
    WaitSignal,
    WaitToolResponse,
)
from .server_record import ServerRecord


class _ScriptStopped(Exception):
    """The connection's script is over: it closed the socket or a required wait failed."""


class LiveSession:
    """The sending side of one connection."""

    def __init__(
        self,
        shared: ServerRecord,
        websocket: ServerConnection,
        record: Connection,
        script: Script,
        profile: Profile,
        *,
        keep_audio: bool = False,
        hold_until_input: float = 0.0,
    ) -> None:
        self.shared = shared
        self.keep_audio = keep_audio
        self.hold_until_input = hold_until_input
        self.websocket = websocket
        self.record = record
        self.script = script
        self.profile = profile
        self.steps_done = False
        self._holding = bool(hold_until_input) and record.resumption_handle is None
        self._queue: asyncio.Queue[tuple[Step, ...]] = asyncio.Queue()
        self._cursors: dict[str, int] = {}
        self._timers: list[asyncio.Task[None]] = []
        # Thinking profiles: is a model turn under way, and has the client been told (or
        # shown, by a tool call) that the model is busy since it last heard IDLE?
        self._turn_under_way = False
        self._busy_reported = False

    async def open(self) -> bool:
        """Answer the setup as scripted. False when the script refuses it."""
        if self.script.refuse_setup == DROP_SETUP:
            self.websocket.transport.abort()  # no close frame: the client sees 1006
            await self.websocket.wait_closed()
            return False
        if self.script.refuse_setup is not None:
            await self.websocket.close(self.script.refuse_setup, self.script.refuse_reason)
            return False
        if self.script.setup_delay:
            await asyncio.sleep(self.script.setup_delay)
        await self.send(protocol.setup_complete())
        if self.profile.usage_after_setup:
            await self.send(protocol.usage_only_content())
        return True

    def enqueue(self, steps: tuple[Step, ...]) -> None:
        """Run these steps after whatever the connection is sending now."""
        self._queue.put_nowait(steps)

    def trigger(self, event: str) -> None:
        """A reply trigger fired; reply only once the script's own steps are done."""
        if self.steps_done and event in self.script.reply_on and self.script.reply:
            self.enqueue(self.script.reply)

    def wake(self) -> None:
        """Something the client sent may have left the session idle: have the runner look."""
        if self.profile.interaction_status:
            self._queue.put_nowait(())

    async def run(self) -> None:
        """The script's steps, then queued replies and injected steps, until closed."""
        try:
            await self._run_steps(self.script.steps)
            self.steps_done = True
            while True:
                await self._report_idle()
                await self._run_steps(await self._queue.get())
        except (_ScriptStopped, ConnectionClosed):
            return
        except Exception as error:  # noqa: BLE001 - surfaced by assert_clean, not lost in a task
            self.shared.errors.append(f"connection {self.record.index} script: {error!r}")

    def cancel_timers(self) -> None:
        for timer in self._timers:
            timer.cancel()

    async def send(self, message: dict[str, Any] | str) -> None:
        """Send one frame and record it (audio summarised unless the server keeps it)."""
        if isinstance(message, dict):
            message = self._with_status(message)
            if self.record.model_output_at is None and _is_model_output(message):
                # Marked before sending: the client's answer to it may be read before send returns.
                self.record.model_output_at = time.time()
        text = message if isinstance(message, str) else json.dumps(message)
        await self.websocket.send(text)
        recorded = message if self.keep_audio else protocol.summarise_audio(message)
        self.record.sent.append(SentMessage(recorded, time.time()))

    async def _run_steps(self, steps: tuple[Step, ...]) -> None:
        for step in steps:
            await self._run_step(step)

    async def _hold_for_input(self) -> None:
        """`hold_until_input`: a fresh model's first output waits for the client's first
        message after the setup (its seed, audio, text), at most that long. Handles, goAway
        and the like go at once (seen: a handle as the first message after setupComplete)."""
        if self._holding and len(self.record.received) <= 1:
            try:
                await self.shared.wait_until(lambda: len(self.record.received) > 1,
                                             self.hold_until_input)
            except TimeoutError:
                pass  # (a client that sends nothing: the script goes on anyway)
        self._holding = False

    async def _run_step(self, step: Step) -> None:
        state = self.record.state
        if self._holding and isinstance(step, (Audio, OutputTranscript, ToolCall,
                                               TurnComplete)):
            await self._hold_for_input()
        match step:
            case Audio(chunks=chunks, chunk_ms=chunk_ms, pause_ms=pause_ms, tone_hz=tone_hz):
                samples = int(chunk_ms * protocol.AUDIO_BYTES_PER_MS) // 2
                for number in range(chunks):
                    await self.send(protocol.audio_chunk(chunk_ms, tone_hz, number * samples))
                    if pause_ms and number < chunks - 1:
                        await asyncio.sleep(pause_ms / 1000)
            case OutputTranscript(text=text):
                state.spoken.append(text)
                state.conversation.append(ConversationEntry("model", text, "spoken"))
                await self.send(protocol.server_content(outputTranscription={"text": text}))
            case InputTranscript(text=text):
                state.conversation.append(ConversationEntry("user", text, "heard"))
                await self.send(protocol.server_content(inputTranscription={"text": text}))
            case TurnComplete(generation_complete=generation_complete):
                if generation_complete:
                    await self.send(protocol.server_content(generationComplete=True))
                await self.send(protocol.server_content(turnComplete=True))
                if self.script.resumption_after_turn and self.record.wants_resumption:
                    await self._resumption_update(ResumptionUpdate())
            case Interrupted():
                await self.send(protocol.server_content(interrupted=True))
            case ToolCall(calls=calls):
                # Registered before sending: the answer may be processed before send returns.
                # An id issued again keeps its first function: a client answers an id once.
                for call in calls:
                    name = "" if "name" in call.omit else call.name
                    if call.id not in state.issued:
                        state.issued[call.id] = name
                        state.modes[call.id] = state.tools.get(name) or self.profile.default_mode
                    if "id" in call.omit:
                        state.anonymous.append(call.id)
                wire = [{key: value for key, value in
                         (("id", call.id), ("name", call.name), ("args", call.args))
                         if key not in call.omit} for call in calls]
                await self.send(protocol.tool_call(wire))
            case CancelToolCalls(ids=ids):
                state.cancelled.update(ids)
                await self.send(protocol.tool_call_cancellation(list(ids)))
            case ResumptionUpdate():
                await self._resumption_update(step)
            case GoAway(time_left=time_left, close_code=close_code):
                await self.send(protocol.go_away(time_left))
                if close_code is not None:
                    self._timers.append(asyncio.create_task(self._close_later(time_left, close_code)))
            case Usage(prompt_tokens=prompt, response_tokens=response):
                await self.send(protocol.usage_metadata(prompt, response))
            case Close(code=code, reason=reason):
                await self.websocket.close(code, reason)
                raise _ScriptStopped
            case Drop():
                self.websocket.transport.abort()
                raise _ScriptStopped
            case Sleep(seconds=seconds):
                await asyncio.sleep(seconds)
            case Raw(text=text):
                await self.send(text)
            case WaitToolResponse(ids=ids, timeout=timeout, required=required):
                await self._wait(
                    lambda: all(state.acted_on(call_id) for call_id in ids),
                    timeout, required, f"results for {list(ids)}",
                )
            case WaitIntermediate(call_id=call_id, count=count, timeout=timeout, required=required):
                await self._wait(
                    lambda: len(state.intermediates.get(call_id, [])) >= count,
                    timeout, required, f"{count} intermediate result(s) of {call_id}",
                )
            case InteractionStatus(status=status):
                await self.send(protocol.interaction_status(status))
            case WaitFor(kind=kind, timeout=timeout, required=required):
                await self._wait(lambda: self._consume(step), timeout, required, f"a {kind} message")
            case Dynamic(plan=plan):
                await self._run_steps(tuple(plan(self.record)))
            case WaitSignal(name=name, timeout=timeout, required=required):
                signal = self.shared.signal_event(name)
                await self._wait(signal.is_set, timeout, required, f"signal {name!r}")
            case _:
                raise TypeError(f"not a script step: {step!r}")

    async def _resumption_update(self, step: ResumptionUpdate) -> None:
        """Issue a handle, or ``resumable=false`` while a BLOCKING call is outstanding
        (Gemini's rule; an open NON_BLOCKING call does not hold the model)."""
        state = self.record.state
        resumable = (
            step.resumable if step.resumable is not None else not state.blocking_outstanding()
        )
        last_consumed = len(self.record.received) - 1
        handle = None
        if resumable:
            handle = self.shared.new_handle_name(self.record.index)
            self.shared.handles[handle] = HandleRecord(
                handle, self.record.index, state.snapshot(), last_consumed, time.time()
            )
        await self.send(
            protocol.resumption_update(
                handle, resumable, last_consumed if step.last_consumed else None
            )
        )

    def _with_status(self, message: dict[str, Any]) -> dict[str, Any]:
        """On a thinking profile: the message with ``interactionStatus`` as it would carry it."""
        if not self.profile.interaction_status:
            return message
        content = message.get("serverContent")
        if not isinstance(content, dict):
            if "toolCall" in message:
                self._busy_reported = True  # the call it opens keeps the model busy
            return message
        if "interactionStatus" in content:  # sent explicitly by the script
            self._busy_reported = content["interactionStatus"] != "IDLE"
            return message
        if any(key in content for key in protocol.TURN_FIELDS):
            self._turn_under_way = True
        if self._turn_under_way or self.record.state.outstanding():
            message = {**message, "serverContent": {**content, "interactionStatus": "IN_PROGRESS"}}
            self._busy_reported = True
        if "turnComplete" in content or "interrupted" in content:
            self._turn_under_way = False  # but not idle: calls and output may follow
        return message

    async def _report_idle(self) -> None:
        """Send ``IDLE`` once no turn is under way, no call open and no step waiting to run."""
        if (
            self._busy_reported
            and not self._turn_under_way
            and not self.record.state.outstanding()
            and self._queue.empty()
        ):
            await self.send(protocol.interaction_status("IDLE"))

    async def _close_later(self, seconds: float, code: int) -> None:
        """Gemini closes the connection when a goAway's time is up."""
        await asyncio.sleep(seconds)
        await self.websocket.close(code, "goAway deadline reached")

    def _consume(self, step: WaitFor) -> bool:
        """Take the next unconsumed message matching ``step``; True if there was one."""
        if step.kind == "function_result":
            pool: list[Any] = [result.to_json() for result in self.record.results]
        else:
            pool = [
                message.body
                for message in self.record.received
                if message.kind != "setup" and step.kind in ("any", message.kind)
            ]
        start = self._cursors.get(step.kind, 0)
        for position in range(start, len(pool)):
            if step.where is None or step.where(pool[position]):
                self._cursors[step.kind] = position + 1
                return True
        return False

    async def _wait(
        self, condition: Callable[[], bool], timeout: float, required: bool, what: str
    ) -> None:
        try:
            await self.shared.wait_until(condition, timeout)
        except TimeoutError:
            if required:
                self.shared.add_violation(
                    "wait_timeout", self.record.index, None,
                    f"script waited {timeout}s for {what}; script stopped",
                )
                raise _ScriptStopped from None


def _is_model_output(message: dict[str, Any]) -> bool:
    """Audio, text, an output transcription or a tool call: the model has taken its turn."""
    if "toolCall" in message:
        return True
    content = message.get("serverContent")
    return isinstance(content, dict) and any(key in content for key in protocol.MODEL_OUTPUT_FIELDS)
