"""Seeding a fresh session, decided on the log (decide.SeedAsked): pure.

A session resumed from a handle holds its history, and a fresh one with nothing to seed holds
all there is: both are logged as holding all (`HoldsAll`). Any other fresh session is seeded
once from the logged conversation (delivery.seed_plan), by write-ahead intents that say what
the seed delivers and whether the model is asked to answer it (`ConversationSending.answer`).
The fold marks the generation seeded (`Generation.seeded`) either way, so a worker that takes
over, and `replay`, see whether a session still awaits its seed.
"""

from __future__ import annotations

from . import events as ev
from .delivery import SeedPlan, seed_plan
from .models import ModelRules
from .state import SessionState


def seed_events(state: SessionState, generation: int, for_reconnect: bool,
                inference_on_context_init: bool) -> list[ev.Event]:
    """The events of the seed of the session of `generation` (none: it is not the live
    session, or its seed was decided already: pipecat asks again on its first context).
    `for_reconnect`: the session replaces one that was lost or left; `inference_on_context_
    init`: the app asks for an answer to the opening context (pipecat's setting)."""
    info = state.generations.get(generation)
    if (not state.connected or generation != state.generation or info is None
            or info.seeded):
        return []
    if info.handle is not None:
        # Resumed: seeding it again would put every earlier result into the model twice.
        return [ev.HoldsAll(generation)]
    plan = seed_plan(state)
    if not plan.turns:
        return [ev.HoldsAll(generation)]  # nothing to seed: any of its handles holds all
    answer = seed_answered(plan, state.rules, for_reconnect, inference_on_context_init)
    return [*(ev.ToolResultSending(cid, generation, "seed", part) for cid, part in plan.parts),
            ev.ConversationSending(generation, plan.through, "seed", answer)]


def seed_answered(plan: SeedPlan, rules: ModelRules, for_reconnect: bool,
                  inference_on_context_init: bool) -> bool:
    """Is the model asked to answer the seed? Always for a result no model was seen to take
    in (the session it went to may have died before it reacted); else pipecat's rule: on
    the first connect as the app asked, after a reconnect as the generation does."""
    if plan.unanswered:
        return True
    if for_reconnect:
        return rules.seed_recap_after_reconnect
    return inference_on_context_init


def seed_turns(turns: list[tuple[str, str]], rules: ModelRules) -> list[tuple[str, str]]:
    """The seed's turns as they go out ("user" or "model"), shaped as the generation takes
    them: on 2.5 a seed ends with a user turn (a blank one if it ends on the model's)."""
    out = [("user" if role == "user" else "model", text) for role, text in turns]
    if rules.seed_ends_with_user_turn and out and out[-1][0] != "user":
        out.append(("user", " "))
    return out


def seed_answer_text(rules: ModelRules, answer: bool) -> str | None:
    """What goes as `realtimeInput.text` after a seed the model is to answer (None: nothing;
    3.x runs no inference on the seed's turnComplete alone)."""
    return " " if answer and rules.seed_answer_by_text else None
