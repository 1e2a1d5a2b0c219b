"""Scripted calls for the crash harness and the demo: what the app does and what Gemini says.

The server side is written as a `Dynamic` plan evaluated per connection: it looks at what
that session's model state already knows (issued calls, results taken in, seeded history)
and asks only for what is still missing — as Gemini would after a resume or a fresh,
seeded session. So one scenario survives any number of worker crashes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from service.local_live import (Audio, Call, Dynamic, GoAway, OutputTranscript, Script,
                                ToolCall, TurnComplete, WaitFor, WaitToolResponse)
from session_store.delivery import lacks_context, unanswered, undelivered_parts
from session_store.lineage import in_model

PROMPT = "You are a helpful order assistant. Be brief."


@dataclass(frozen=True)
class Scenario:
    name: str
    calls: tuple[tuple[str, dict], ...]  # logical calls (unique tool names), in order
    parallel: bool = False  # ask for all calls in one toolCall
    new_prompt: str | None = None  # app changes system_instruction when the bot first speaks
    idempotent: frozenset[str] = frozenset()
    go_away_after_first: bool = False  # server sends goAway once the first call is answered
    tool_delay_s: float = 0.05
    description: str = ""
    # What the app says and does (the live demo talks to a real model, which needs more).
    prompt: str | None = None  # None: PROMPT
    user_turn: str = "Where is my order 42?"
    tool_descriptions: dict[str, str] = field(default_factory=dict)
    tool_results: dict[str, dict] = field(default_factory=dict)
    # Scripted scenarios ask for every tool; a real model chooses (at least one is needed).
    every_tool_required: bool = True
    # Tools that report this many intermediate results before their outcome (registered
    # with cancel_on_interruption=False: pipecat declares them NON_BLOCKING where the model
    # takes such declarations, and only such calls take intermediate results).
    progress: dict[str, int] = field(default_factory=dict)
    # Tools with an outcome check that asks the ledger by the call's idempotency key
    # (worker.py); `unsure`: the check cannot tell (the system it asks is down);
    # `rerun_if_not_done`: a call the check says was not done runs again.
    checked: frozenset[str] = frozenset()
    unsure: bool = False
    rerun_if_not_done: bool = False

    @property
    def tool_names(self) -> list[str]:
        return [name for name, _ in self.calls]


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("single_call", (("lookup_order", {"id": 42}),),
             description="one tool call while the bot speaks"),
    Scenario("prompt_change", (("lookup_order", {"id": 42}), ("refund_order", {"id": 42})),
             new_prompt="You are a refunds specialist. Be brief.",
             description="two calls; the prompt changes mid-turn (the demo call)"),
    Scenario("parallel_calls", (("lookup_order", {"id": 7}), ("check_stock", {"sku": "A1"})),
             parallel=True, description="two calls in one toolCall"),
    Scenario("idempotent_tool", (("send_receipt", {"id": 42}), ("lookup_order", {"id": 42})),
             idempotent=frozenset({"send_receipt"}), tool_delay_s=0.3,
             description="an idempotent tool re-run with its key when in doubt"),
    Scenario("go_away", (("lookup_order", {"id": 1}), ("refund_order", {"id": 1})),
             go_away_after_first=True, description="goAway between two calls"),
    Scenario("progress_call", (("track_parcel", {"id": 9}), ("lookup_order", {"id": 9})),
             progress={"track_parcel": 2}, tool_delay_s=0.15,
             description="a NON_BLOCKING call that reports two intermediate results"),
    Scenario("checked_refund", (("refund_order", {"id": 42}),),
             checked=frozenset({"refund_order"}), rerun_if_not_done=True, tool_delay_s=0.3,
             description="a refund (not idempotent) whose outcome check asks the ledger"),
    Scenario("unsure_refund", (("refund_order", {"id": 42}),),
             checked=frozenset({"refund_order"}), unsure=True, tool_delay_s=0.3,
             description="a refund whose outcome check cannot tell: outcome unknown"),
    Scenario("live", (("lookup_order", {"id": 42}), ("refund_order", {"id": 42})),
             new_prompt=("You are a refunds specialist for an online shop. Be brief. When the "
                         "customer wants a refund, call refund_order with the order id."),
             prompt=("You are an order assistant for an online shop. Be brief. For any "
                     "question about an order, call lookup_order with the order id before "
                     "answering."),
             user_turn=("Hi! Where is my order 42? It is late; if it has not arrived, please "
                        "refund it."),
             tool_descriptions={"lookup_order": "Look up an order's status by its id.",
                                "refund_order": "Refund an order by its id."},
             tool_results={"lookup_order": {"order": 42, "status": "lost in transit"},
                           "refund_order": {"order": 42, "refunded": True, "amount": "59.90 EUR"}},
             tool_delay_s=0.5, every_tool_required=False,
             description="the live demo: a real model decides what to call"),
]}

# Scenarios the offline crash harness runs (the live one needs the real API).
SCRIPTED = tuple(name for name in SCENARIOS if SCENARIOS[name].every_tool_required)


def scripted_for(model: str) -> tuple[str, ...]:
    """The scripted scenarios a model can run: intermediate results need NON_BLOCKING calls,
    which 3.1 does not have (pipecat refuses such tools there)."""
    from session_store.models import rules_for

    rules = rules_for(model)
    return tuple(name for name in SCRIPTED if not SCENARIOS[name].progress
                 or rules.non_blocking_declarations)


@dataclass
class ServerPlan:
    """Gemini's side of a scenario, across every connection of the call."""

    scenario: Scenario
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    go_away_sent: bool = False

    def script(self, conn) -> Script:
        # A fresh session is seeded first (clientContent); planning waits for the seed, as a
        # real model says nothing before its first input, however long a worker under load
        # takes to send it. A resumed session holds its context already and gets no seed.
        seed_wait = 0.6 if conn.resumption_handle is not None else 20.0
        return Script([WaitFor("client_content", timeout=seed_wait, required=False),
                       Dynamic(self.plan)], reply=())

    def plan(self, conn) -> list:
        state = conn.state
        answered = state.answered_names()
        pending = [(n, a) for n, a in self.scenario.calls if n not in answered]
        if (self.scenario.go_away_after_first and not self.go_away_sent and answered
                and pending):
            self.go_away_sent = True
            return [GoAway(time_left=8.0), Dynamic(self.plan)]
        if not pending:
            return [Audio(chunks=2), OutputTranscript("Is there anything else?"), TurnComplete()]
        outstanding = [cid for cid in state.outstanding()
                       if state.issued.get(cid) in {n for n, _ in pending}]
        if outstanding:
            return [WaitToolResponse(outstanding, timeout=30, required=False), Dynamic(self.plan)]
        batch = pending if self.scenario.parallel else pending[:1]
        calls = [Call(f"{name}-{next(self._ids)}", name, args) for name, args in batch]
        return [Audio(chunks=4), OutputTranscript("Let me check that for you."),
                ToolCall(calls), Audio(chunks=4), TurnComplete(),
                WaitToolResponse([c.id for c in calls], timeout=30, required=False),
                Dynamic(self.plan)]


def scenario_complete(scenario: Scenario, state) -> bool:
    """From the log alone: every logical call's result is in the model, settings applied."""
    for name in scenario.tool_names:
        if not any(c.name == name and c.has_outcome and in_model(state, c)
                   for c in state.calls.values()):
            return False
    if scenario.new_prompt and (state.settings.get("system_instruction") != scenario.new_prompt
                                or lacks_context(state)):
        return False
    return (state.connected and not state.reconnect_pending and not state.bot_speaking
            and not unanswered(state) and not undelivered_parts(state))


def live_complete(scenario: Scenario, quiet_s: float = 6.0):
    """Completion for a real model, which decides itself what to call: at least one result
    has reached it, nothing it asked for is unanswered, the new prompt is applied (the app
    changes it when the bot first speaks), and the bot has been silent for `quiet_s` with
    nothing new asked (so a follow-up call, e.g. the refund, is not cut off)."""
    quiet_since: list[float] = []

    def complete(state) -> bool:
        import time

        settled = (
            any(c.has_outcome and in_model(state, c) for c in state.calls.values())
            and (not scenario.new_prompt
                 or state.settings.get("system_instruction") == scenario.new_prompt)
            and state.connected and not state.reconnect_pending and not state.bot_speaking
            and not unanswered(state))
        if not settled:
            quiet_since.clear()
            return False
        if not quiet_since:
            quiet_since.append(time.monotonic())
        return time.monotonic() - quiet_since[0] >= quiet_s

    return complete
