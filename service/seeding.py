"""Seeding: what a fresh Gemini Live session is told of the call so far.

A session resumed from a
handle already holds its history; a fresh one (first connect, a handle too old, a takeover
without one) is seeded once from the logged conversation and the results the model has not
got, by the delivery rules (session_store.delivery.seed_plan). The seed is a send of
results, so it follows the same write-ahead rule as any other send: intent, send, confirm.
"""

from __future__ import annotations

from dataclasses import replace

from google.genai.types import Content, Part
from loguru import logger

from session_store import events as ev
from session_store.delivery import SeedPlan, seed_plan
from session_store.storable import storable_events

from .effects import EffectRunner
from .handle_gate import HandleGate
from .port import ServicePort
from .speech import SpeechTracker
from .step import Drain, Stepper


class Seeder:
    """Seeds fresh sessions from the log, once each (pipecat's side: `svc`)."""

    def __init__(self, svc: ServicePort, effects: EffectRunner, speech: SpeechTracker,
                 handles: HandleGate, stepper: Stepper):
        self._svc = svc
        self._driver = svc.driver
        self._effects = effects
        self._step = stepper.step
        self._speech = speech
        self._handles = handles
        self._seeded_generation = 0

    def awaiting_seed(self) -> bool:
        """A fresh session takes no result on its own before its seed: the seed carries every
        result the log has, so one sent just before it reaches the model twice. (Seen in the
        crash harness: a takeover worker's first session is ready before the pipeline's
        first context, so pipecat seeds only later; a result sent as content in between was
        then seeded again.) The seed comes with the first context frame at the latest."""
        state = self._driver.state
        current = state.generations.get(state.generation)
        return (current is not None and current.handle is None
                and self._seeded_generation != state.generation)

    async def seed(self, for_reconnect: bool) -> None:
        """Seed a fresh session from the log (upstream seeds from the pipecat context)."""
        # Under the effects lock: a seed is a send of results, and no other task may decide
        # to send the same results while it is under way (found by the crash harness).
        async with self._effects.due_lock:
            await self._seed(for_reconnect)
        await self._effects.perform_due()  # results held back until the seed

    async def _seed(self, for_reconnect: bool) -> None:
        svc = self._svc
        if svc._disconnecting:
            return
        if not svc._session:
            svc.apply(replace(svc.pipecat_state, run_llm_when_session_ready=True))
            return
        if not await self._log_initial_context():
            return  # fenced
        state = self._driver.state
        if self._seeded_generation == state.generation:
            # pipecat asks again (first context after session ready): one seed per session,
            # or every result in it would reach the model twice.
            return
        generation = self._seeded_generation = state.generation
        current = state.generations.get(state.generation)
        if current is not None and current.handle is not None:
            # A resumed session already holds its history: seeding it again would put every
            # earlier result into the model twice (upstream does, on its first context).
            self._handles.holds_everything(generation)
            self._ready_for_input()
            return
        # A fresh session gets the whole conversation: a state from a snapshot lacks it.
        await self._driver.ensure_history()
        state = self._driver.state
        plan = seed_plan(state)
        if not plan.turns:
            self._handles.holds_everything(generation)  # nothing to seed: any handle holds it
            self._ready_for_input()
            return
        # A result no model was seen to take in (a session it went to may have died before
        # it reacted) asks for an answer; else pipecat's rule (2.5 recaps after a reconnect).
        trigger = (plan.unanswered
                   or (not for_reconnect and svc._inference_on_context_initialization)
                   or (for_reconnect and not svc._is_gemini_3))
        contents = [Content(role="user" if role == "user" else "model", parts=[Part(text=text)])
                    for role, text in plan.turns]
        if not svc._is_gemini_3 and contents[-1].role != "user":
            contents.append(Content(role="user", parts=[Part(text=" ")]))
        # Write-ahead, as any send: what the seed delivers (results, and the turns up to
        # `through`, which a session resumed later from this one's handles then holds).
        intents = _seed_events(plan, generation, sent=False)
        # (Under the effects' lock already: the seed's caller drains after it.)
        if intents and await self._step(intents, drain=Drain.NO) is None:
            return  # fenced
        session = svc._session
        if generation != self._driver.state.generation or session is None:
            return  # its session went meanwhile: never seed another (`deliver`); the next
            # session seeds itself, and the intents above stay unconfirmed (resent then)
        # Handles are withheld until the model reacts to the seed (ev.HandleWithheld).
        self._handles.sending(generation, self._speech.model_generating)
        try:
            await session.send_client_content(turns=contents, turn_complete=trigger)
            if svc._is_gemini_3 and trigger:
                await session.send_realtime_input(text=" ")
        except Exception as exc:  # noqa: BLE001 - the seed stays unconfirmed: resent next time
            logger.warning(f"{svc}: seeding failed: {exc}")
            await self._effects.after_send_failure(exc, "seed", generation)
            return
        confirmations = _seed_events(plan, generation, sent=True)
        if confirmations and await self._step(confirmations, drain=Drain.NO) is None:
            return  # fenced
        self._ready_for_input()

    def _ready_for_input(self) -> None:
        """pipecat may send the caller's audio now (it holds it until the session's seed)."""
        self._svc.apply(replace(self._svc.pipecat_state, ready_for_realtime_input=True))

    async def _log_initial_context(self) -> bool:
        """Log the pipecat context's opening messages once, so any worker can seed from them.
        False if fenced."""
        context = self._svc._context
        if context is None or self._driver.state.messages:
            return True
        events = []
        for message in context.get_messages():
            role = message.get("role") if isinstance(message, dict) else None
            text = _message_text(message) if role in ("user", "developer", "assistant") else None
            if text:
                # One by one: a message the log cannot store (a lone surrogate from text
                # decoded with surrogateescape) becomes an anomaly and the rest are kept;
                # recorded as it was, it failed every connection attempt of the call.
                # Generation 0: no session heard it; only a seed puts it into a model state.
                events += storable_events([ev.ConversationMessage(
                    "assistant" if role == "assistant" else "user", text, 0)],
                    self._driver.state.generation)
        return not events or await self._step(events, drain=Drain.NO) is not None


def _seed_events(plan: SeedPlan, generation: int, *, sent: bool) -> list[ev.Event]:
    """The intents (or, `sent`, the confirmations) of what a seed delivers."""
    result, turns = ((ev.ToolResultSent, ev.ConversationSent) if sent
                     else (ev.ToolResultSending, ev.ConversationSending))
    events: list[ev.Event] = [result(cid, generation, "seed", part) for cid, part in plan.parts]
    if plan.through:
        events.append(turns(generation, plan.through, "seed"))
    return events


def _message_text(message: dict) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return content.strip() or None
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return " ".join(t for t in texts if t).strip() or None
    return None
