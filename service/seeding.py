"""Seeding: what a fresh Gemini Live session is told of the call so far.

A session resumed from a handle already holds its history; a fresh one (first connect, a
handle too old, a takeover without one) is seeded once from the logged conversation and the
results the model has not got. What is seeded, and whether the model is asked to answer it,
is decided on the log (decide.SeedAsked, session_store.seeding); this performs the send the
decision's write-ahead intents name, then confirms it: intent, send, confirm.
"""

from __future__ import annotations

from dataclasses import replace

from google.genai.types import Content, Part
from loguru import logger

from session_store import events as ev
from session_store.decide import SeedAsked
from session_store.delivery import SeedPlan, seed_plan
from session_store.seeding import seed_answer_text, seed_turns
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

    def awaiting_seed(self) -> bool:
        """A fresh session takes no result on its own before its seed is decided: the seed
        carries every result the log has, so one sent just before it reaches the model
        twice. Read from the log (`Generation.seeded`), as a worker that takes over reads
        it. The seed comes with the first context frame at the latest."""
        state = self._driver.state
        current = state.generations.get(state.generation)
        return current is not None and current.handle is None and not current.seeded

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
        current = state.generations.get(state.generation)
        if current is None or current.seeded:
            # pipecat asks again (first context after session ready): one seed each; a
            # resumed session's was decided when it came up (it holds all it was told).
            if current is not None and current.handle is not None:
                self._ready_for_input()
            return
        generation = state.generation
        plan: SeedPlan | None = None
        if current.handle is None:
            # A fresh session gets the whole conversation: a state from a snapshot lacks it.
            await self._driver.ensure_history()
            plan = seed_plan(self._driver.state)
        # Decided and logged with the write-ahead intents of what the seed delivers (results,
        # and the turns up to `through`, which a session resumed later from this one's
        # handles then holds). Under the effects' lock already: the caller drains after it.
        decision = await self._step(SeedAsked(generation, for_reconnect,
                                              bool(svc._inference_on_context_initialization)),
                                    drain=Drain.NO)
        if decision is None:
            return  # fenced
        if current.handle is not None or any(isinstance(e, ev.HoldsAll)
                                             for e in decision.events):
            self._ready_for_input()  # (a resumed one's may have come with a commit before)
            return
        sending = next((e for e in decision.events if isinstance(e, ev.ConversationSending)
                        and e.via == "seed"), None)
        if sending is None:
            return  # not the live session any more, or seeded meanwhile: nothing to send
        parts = [(e.call_id, e.part) for e in decision.events
                 if isinstance(e, ev.ToolResultSending)]
        if plan is None or (plan.through, plan.parts) != (sending.through, parts):
            plan = seed_plan(self._driver.state)  # the log moved on before the decision
        session = svc._session
        if generation != self._driver.state.generation or session is None:
            return  # its session went meanwhile: never seed another (`deliver`); the next
            # session seeds itself, and the intents above stay unconfirmed (resent then)
        rules = self._driver.state.rules
        contents = [Content(role=role, parts=[Part(text=text)])
                    for role, text in seed_turns(plan.turns, rules)]
        # Handles are withheld until the model reacts to the seed (ev.HandleWithheld).
        self._handles.sending(generation, self._speech.model_generating)
        try:
            await session.send_client_content(turns=contents, turn_complete=sending.answer)
            text = seed_answer_text(rules, sending.answer)
            if text is not None:
                await session.send_realtime_input(text=text)
        except Exception as exc:  # noqa: BLE001 - the seed stays unconfirmed: resent next time
            logger.warning(f"{svc}: seeding failed: {exc}")
            await self._effects.after_send_failure(exc, "seed", generation)
            return
        confirmations: list[ev.Event] = [ev.ToolResultSent(cid, generation, "seed", part)
                                         for cid, part in parts]
        confirmations.append(ev.ConversationSent(generation, sending.through, "seed"))
        if await self._step(confirmations, drain=Drain.NO) is None:
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


def _message_text(message: dict) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return content.strip() or None
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return " ".join(t for t in texts if t).strip() or None
    return None
