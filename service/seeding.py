"""Seeding: what a fresh Gemini Live session is told of the call so far.

A mixin of DurableGeminiLiveLLMService (split out of gemini_live.py). A session resumed from a
handle already holds its history; a fresh one (first connect, a handle too old, a takeover
without one) is seeded once from the logged conversation and the results the model has not
got, by the delivery rules (session_store.decide.seed_history). The seed is a send of
results, so it follows the same write-ahead rule as any other send: intent, send, confirm.
"""

from __future__ import annotations

from google.genai.types import Content, Part
from loguru import logger

from session_store import events as ev
from session_store.decide import seed_history

from .driver import storable


class SessionSeeding:
    """Seeds fresh sessions from the log, once each (uses the service's driver and session)."""

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
        generation = self._seeded_generation = state.generation
        current = state.generations.get(state.generation)
        if current is not None and current.handle is not None:
            # A resumed session already holds its history: seeding it again would put every
            # earlier result into the model twice (upstream does, on its first context).
            self._handles_hold_sends = generation
            self._ready_for_realtime_input = True
            return
        # A fresh session gets the whole conversation: a state from a snapshot lacks it.
        await self._driver.ensure_history()
        state = self._driver.state
        turns = seed_history(state)
        if not turns:
            self._handles_hold_sends = generation  # nothing to seed: any handle holds it all
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
        if seeded:
            await self._driver.record(*(ev.ToolResultSending(c.call_id, generation, "seed")
                                        for c in seeded))
        if generation != self._driver.state.generation or self._session is None:
            return  # its session went meanwhile: never seed another (`_deliver`); the next
            # session seeds itself, and the intents above stay unconfirmed (resent then)
        # Handles are withheld until the model reacts to the seed (ev.HandleWithheld).
        self._sending_content(generation)
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
        if self._context is None or self._driver.state.messages:
            return
        events = []
        for message in self._context.get_messages():
            role = message.get("role") if isinstance(message, dict) else None
            text = _message_text(message) if role in ("user", "developer", "assistant") else None
            if text:
                # One by one: a message the log cannot store (a lone surrogate from text
                # decoded with surrogateescape) becomes an anomaly and the rest are kept;
                # recorded as it was, it failed every connection attempt of the call.
                events += storable([ev.ConversationMessage(
                    "assistant" if role == "assistant" else "user", text,
                    self._driver.state.generation)], self._driver.state.generation)
        if events:
            await self._driver.record(*events)



def _message_text(message: dict) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return content.strip() or None
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return " ".join(t for t in texts if t).strip() or None
    return None
