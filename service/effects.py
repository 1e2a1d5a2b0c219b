"""Acting on the log: how DurableGeminiLiveLLMService performs what is due.

Every action follows one rule: the fact or the intent is committed to the log first, then it
is performed. A commit (a step, service/step.py) asks the pure `session_store.delivery.due`
once and logs the intents of what the caller acts on (a `Decision`); `perform` carries out
that decision. Live operation and takeover after a crash both go through `perform_due`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Protocol

from google.genai.types import Content, FunctionResponse, FunctionResponseScheduling, Part
from loguru import logger
from pipecat.adapters.llm.services.gemini_adapter import GeminiLLMAdapter
from pipecat.frames.frames import FunctionCallFromLLM
from websockets.exceptions import ConnectionClosed

from session_store import events as ev
from session_store.answers import cancelled_on_wire
from session_store.decide import SendFailed
from session_store.delivery import (Effect, Reconnect, catch_up_turns, result_as_content,
                                    result_scheduling, result_value)
from session_store.intents import ALL, LOGGED, SENDS

from .cut_telling import tell_cut
from .driver import Decision
from .handle_gate import HandleGate
from .log_writer import LogWriter, When
from .port import ServicePort
from .setup_context import SetupContext
from .speech import SpeechTracker
from .step import Drain, Stepper


class Connection(Protocol):
    """What the effects need of the link (link.py), which is made after them."""

    @property
    def up(self) -> bool: ...

    @property
    def busy(self) -> bool: ...

    def schedule(self, reason: str, *, planned: bool = False) -> None: ...


class EffectRunner:
    """Performs what the log says is due, one at a time (`due_lock`), for one service."""

    def __init__(self, svc: ServicePort, log: LogWriter, speech: SpeechTracker,
                 handles: HandleGate, setup: SetupContext, stepper: Stepper):
        self._svc = svc
        self._driver = svc.driver
        self._log = log
        self._step = stepper.step
        self._setup = setup
        self._speech = speech
        self._handles = handles
        self.link: Connection | None = None  # set once the link exists
        # A send's intent is logged only if the session can carry it then (asked on the
        # state being committed: a fresh session awaiting its seed takes no result).
        self._driver.can_send = lambda: self._link.up
        #: Held while effects are decided and performed (a seed too): no other task may
        #: decide to send the same results meanwhile.
        self.due_lock = asyncio.Lock()
        # Ids Gemini cancelled, as they come off the wire: a start committed meanwhile (the
        # cancellation waiting behind it to be logged) must not run (`run_started`).
        self.cancelled_on_wire: set[str] = set()

    @property
    def _link(self) -> Connection:
        assert self.link is not None
        return self.link

    def _sending_content(self, generation: int) -> None:
        """Handles are withheld until the model reacts to what goes out (withholding.py)."""
        self._handles.sending(generation, self._speech.model_generating)

    # ------------------------------------------------------------------ what is due
    def cancelled(self, call_id: str) -> bool:
        """Did Gemini cancel this call on the wire, or an id that re-asked for it?"""
        return cancelled_on_wire(self._driver.state, call_id, self.cancelled_on_wire)

    async def run_started(self, events: list[ev.Event]) -> None:
        """Run the calls whose start was just committed (write-ahead: never before), unless
        Gemini cancelled them meanwhile: a toolCallCancellation read while the start was
        being committed could only be noted (the log was busy with that very commit), and
        is logged after it. The start in the log is then an intent never carried out."""
        calls = [self._driver.state.calls[e.call_id] for e in events
                 if isinstance(e, ev.ToolCallStarted)]
        for call in calls:
            if self.cancelled(call.call_id):
                continue
            await self._svc.run_function_calls([FunctionCallFromLLM(
                function_name=call.name, tool_call_id=call.call_id, arguments=call.args,
                context=self._svc._context)])

    async def perform_due(self, kinds: frozenset[type] = ALL, *,
                          after: Decision | None = None) -> None:
        """Do what the log says is due now (of `kinds`), until nothing is. `after`: the
        commit this follows, whose `due` holds for the first round if nothing was committed
        since (it was asked a moment ago, on the same state)."""
        async with self.due_lock:
            for _ in range(100):
                try:
                    acted = await self.perform_round(kinds, after)
                    after = None
                except Exception as exc:  # noqa: BLE001 - the log writer's task retries
                    logger.error(f"{self._svc}: call {self._driver.call_id}: could not "
                                 f"perform what is due, retrying once the log takes it: "
                                 f"{type(exc).__name__}: {exc}")
                    self._log.retry_effects()
                    return
                if not acted:  # (acting changes what is due: a settled call's answer)
                    return

    async def due_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.perform_due()

    async def perform_round(self, kinds: frozenset[type], after: Decision | None = None
                            ) -> bool:
        """One decision and its effects, `due` asked at most once: by the commit, on the
        state with the notes folded in (a note may change it: speech started, content
        waits), which appends nothing if nothing is due. While notes wait (or the log is
        busy, or the state must be re-read) it is asked first on the state as it is, to see
        whether a commit is worth making: with nothing due, lazy notes wait to share the next
        one. `after`: the commit this round follows; if nothing was committed since, its
        `due` is that answer, asked a moment ago on this very state."""
        driver = self._driver
        if driver.fenced:
            return False
        if not self._link.up:
            kinds = kinds - SENDS
        effects: list[Effect] | None = None
        if after is not None and after.due_at == driver.state.version and not driver.stale:
            effects = after.effects
        elif driver.has_notes or driver.busy or driver.stale:
            effects = driver.due()
        if effects is not None:
            wanted = [e for e in effects if type(e) in kinds]
            if not any(type(e) in LOGGED for e in wanted):
                return await self.perform(Decision(effects=wanted), kinds)
        decision = await self._step(intend=kinds, drain=Drain.NO)
        return decision is not None and decision.acted

    async def perform(self, decision: Decision, kinds: frozenset[type] = ALL) -> bool:
        """Perform what one commit decided, after it: the calls whose start it logged run,
        then the sends whose intent it logged go out, in `due`'s order; a reconnect it found
        due is scheduled. True if anything was done."""
        logged = decision.intents
        # (A reconnect requested with an intent, for a cut turn, is due now or later: the
        # next round asks.)
        acted = any(isinstance(e, (ev.ToolCallFailed, ev.ToolCallStarted, ev.ReconnectRequested))
                    for e in logged)
        await self.run_started(logged)
        for intent in logged:
            if isinstance(intent, ev.ContextSending):
                acted |= await self._apply_context(intent)
            elif isinstance(intent, ev.ConversationSending):
                acted |= await self._send_conversation(intent)
            elif isinstance(intent, ev.CutTelling) and intent.via == "content":
                # ("reseed": the reconnect logged with it does the telling, below)
                acted |= await tell_cut(intent, self._svc._session, self._driver.state,
                                        self._log, sending=self._sending_content,
                                        failed=self.after_send_failure)
        acted |= await self.deliver(logged)
        if Reconnect in kinds and not self._link.busy:
            for effect in decision.effects:
                if isinstance(effect, Reconnect):
                    self._link.schedule(effect.reason, planned=True)
        return acted

    # ------------------------------------------------------------------ sends
    async def _apply_context(self, intent: ev.ContextSending) -> bool:
        """Send the in-session settings (system instruction, tools) as a contextUpdate:
        intent logged first, confirmed once the write returned (noted, like a result's)."""
        svc, gen, session = self._svc, intent.generation, self._svc._session
        if session is None or gen != self._driver.state.generation:
            return False
        try:
            instruction, tools = await self._setup.now()
            self._sending_content(gen)  # a handle may cross it on the wire, as content
            await session.send_context_update(system_instruction=instruction, tools=tools)
        except Exception as exc:  # noqa: BLE001 - unconfirmed: sent again by the rules
            logger.warning(f"{svc}: the contextUpdate failed: {exc}")
            await self.after_send_failure(exc, "context_update", gen)
            return False
        await self._log.log(ev.ContextSent(gen, intent.version), when=When.LAZY)
        return True

    async def _send_conversation(self, intent: ev.ConversationSending) -> bool:
        """Tell a resumed session the turns its handle's state lacks, as content that does not
        ask for an answer (google-genai's clientContent with turnComplete false)."""
        svc, gen = self._svc, intent.generation
        await self._driver.ensure_history()  # the turns, from the whole log
        session = svc._session
        if session is None or gen != self._driver.state.generation:
            return False
        turns = catch_up_turns(self._driver.state, intent.through)
        contents = [Content(role="user" if role == "user" else "model", parts=[Part(text=text)])
                    for role, text in turns]
        try:
            self._sending_content(gen)  # handles withheld until the model reacts to it
            await session.send_client_content(turns=contents, turn_complete=False)
        except Exception as exc:  # noqa: BLE001 - unconfirmed: sent again by the rules
            logger.warning(f"{svc}: telling the session the turns it lacks failed: {exc}")
            await self.after_send_failure(exc, "conversation", gen)
            return False
        await self._log.log(ev.ConversationSent(gen, intent.through, "content"),
                            when=When.LAZY)
        return True

    async def deliver(self, sending: list[ev.Event]) -> bool:
        """Send results whose intent was just committed; confirm those that went out."""
        sent = []
        for intent in sending:
            if not isinstance(intent, ev.ToolResultSending):
                continue
            if intent.generation != self._driver.state.generation or self._svc._session is None:
                # The session it was meant for is gone (a reconnect got in between): never
                # send on another one (a toolResponse for an id it did not issue silences the
                # model). Left unconfirmed, it is resent by the delivery rules, like a send
                # that failed. (pipecat sets `_session` only after the new session's
                # Connected is logged, so a live session always has the current generation.)
                continue
            call = self._driver.state.calls[intent.call_id]
            if await self._send_result(call, intent.via, intent.part):
                sent.append(ev.ToolResultSent(call.call_id, intent.generation, intent.via,
                                              intent.part))
        # Noted, not committed here: a result's send is confirmed with the next append (or
        # by the log writer's task), one commit fewer per tool call and none between the
        # send and the next message. Until then `due` sees the send under way on this
        # session and does not repeat it; a reconnect logs the notes first; and a crash
        # before they are logged leaves the send unconfirmed, which the delivery rules
        # resolve (I3) exactly as for a crash right after the send.
        if sent:
            await self._log.log(*sent, when=When.LAZY)
        return bool(sent)

    async def _send_result(self, call, via: str, part: int = 0) -> bool:
        svc, session = self._svc, self._svc._session
        generation = self._driver.state.generation
        try:
            if via == "tool_response":
                response = GeminiLLMAdapter.to_function_response_dict(
                    json.dumps(result_value(call, part), ensure_ascii=False))
                message = FunctionResponse(id=call.call_id, name=call.name, response=response)
                if call.mode == "non_blocking":
                    # The server issues handles while a NON_BLOCKING call is open, so one may
                    # cross this response on the wire (read after it, issued before): its
                    # handles are withheld until the model is seen to react, as for content.
                    self._sending_content(self._driver.state.generation)
                    # Each response says whether more follow (an intermediate result) or it
                    # closes the call; where the model takes it, how the model takes it (as
                    # pipecat does, in the response too: the guides put it there, the API
                    # reference in a field of its own).
                    message.will_continue = part != 0
                    scheduling = result_scheduling(call, part, self._driver.state.rules)
                    if scheduling is not None:
                        message.response = {**response, "scheduling": scheduling}
                        message.scheduling = FunctionResponseScheduling(scheduling)
                await session.send_tool_response(function_responses=[message])
            elif via == "text":
                # Models from 3.1 on take clientContent only as a fresh session's first
                # history: anything else closes the socket (1007).
                self._sending_content(self._driver.state.generation)
                await session.send_realtime_input(text=result_as_content(call, part))
            else:
                # Handles are withheld until the model reacts to it (ev.HandleWithheld).
                self._sending_content(self._driver.state.generation)
                await session.send_client_content(
                    turns=[Content(role="user", parts=[Part(text=result_as_content(call,
                                                                                    part))])],
                    turn_complete=True)
        except Exception as exc:  # noqa: BLE001 - unconfirmed: the next session resends it
            logger.warning(f"{svc}: sending the result of {call.call_id} failed: {exc}")
            await self.after_send_failure(exc, "result", generation)
            return False
        return True

    async def after_send_failure(self, exc: Exception, what: str, generation: int) -> None:
        """A send failed: observed, and decided on the log (decide.SendFailed: a closed
        socket is left to the receive loop, any other failure replaces the session, through
        what is due once it is logged). Handed to the log writer's task, never committed
        here: this runs under the effects' lock, which that commit's drain takes."""
        task = self._svc._connection_task
        closed = isinstance(exc, ConnectionClosed) and task is not None and not task.done()
        await self._log.log(SendFailed(generation, what, closed,
                                       f"{type(exc).__name__}: {exc}"[:300]), when=When.SOON)
