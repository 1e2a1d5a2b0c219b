"""Delivery rules, as pure functions of the projected state (no I/O).

`due(state, policy, now_us)` says what must happen now (start a call, send a result, bring a
model up to date, reconnect); `choose_resumption` and `seed_plan` say which model state a new
session starts from and what it must be told; the `result_*` functions say how a result is
put to the model. Live operation and crash recovery run the same functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from . import cut_notes
from .models import ModelRules, prompt_tokens
from .policy import Policy
from .lineage import (context_held, handle_may_hold, holds_cut_turn, in_model, lineage_cutoffs,
                      result_held, send_held, unconfirmed_sends, unheld_calls,
                      unheld_messages)
from .state import CallState, Cover, Handle, Send, SessionState


# --------------------------------------------------------------------------- what the model lacks

def undelivered(state: SessionState) -> list[CallState]:
    """Calls with an outcome the current model state does not hold (a superseded call
    is answered through the id that re-asked for it). The lineage is walked once: `due`
    asks this several times per tool call, over every call of the call (walked per call,
    it cost 1.2 ms per ask with 1,000 calls)."""
    lineage = lineage_cutoffs(state)
    return [c for c in state.calls.values()
            if c.has_outcome and not c.superseded_by and not result_held(lineage, c)]


def undelivered_parts(state: SessionState) -> list[tuple[CallState, int]]:
    """(call, part) for each result the current model state lacks, in the order they must
    go: a call's intermediate results in order, then its outcome. Intermediate results of
    a call whose outcome the model holds no longer count (the server takes nothing after
    the closing response), nor do any on a model that takes none (ModelRules)."""
    lineage = lineage_cutoffs(state)
    progress = state.rules.intermediate_results  # (logged either way: a fact of the call)
    out = []
    for c in state.calls.values():
        if c.superseded_by or result_held(lineage, c):
            continue
        for p in c.progress if progress else ():
            if not any(send_held(lineage, s) for s in p.sends):
                out.append((c, p.part))
        if c.has_outcome:
            out.append((c, 0))
    return out


def lacks_context(state: SessionState, handle: Handle | None = None) -> bool:
    """Does the current model state (with `handle`: a session resumed from it) lack the
    latest in-session settings?"""
    return context_held(state, handle) < state.context_version


def unconfirmed(state: SessionState) -> list[Send | Cover]:
    """Every send whose success is unconfirmed: results, intermediate results, context
    updates, conversation seeds and catch-ups."""
    out: list[Send | Cover] = [s for _c, s in unconfirmed_sends(state)]
    out += [c for c in state.context_sends + state.conversation_sends if not c.confirmed]
    return out


def session_knows_call(state: SessionState, call: CallState) -> bool:
    """Did the current session (or the state it resumed) issue this call id?"""
    for gen, cutoff in lineage_cutoffs(state).items():
        if call.generation == gen and (cutoff is None or call.requested_version < cutoff):
            return True
    return False

def unanswered(state: SessionState) -> list[CallState]:
    """Every call not yet settled (I1: each ends delivered or cancelled)."""
    return [c for c in state.calls.values() if not settled(state, c)]


def settled(state: SessionState, call: CallState) -> bool:
    if call.superseded_by:
        return settled(state, state.calls[call.superseded_by])
    return call.status == "cancelled" or (call.has_outcome and in_model(state, call))


# --------------------------------------------------------------------------- effects

@dataclass(frozen=True)
class StartCall:
    call_id: str
    attempt: int
    idempotency_key: str


@dataclass(frozen=True)
class ResolveInDoubt:
    """Record an explicit "outcome unknown" failure for a non-idempotent in-doubt call."""
    call_id: str


@dataclass(frozen=True)
class CheckOutcome:
    """Ask the tool's outcome check, by the idempotency key, whether an in-doubt call took
    effect (the answer is logged by `outcomes.answer_events`). A read: it has no intent."""
    call_id: str
    idempotency_key: str


@dataclass(frozen=True)
class SendResult:
    """Send a call's outcome (part 0) or its intermediate result `part`. `via`: a
    toolResponse to a session that issued the id; otherwise content, as `clientContent`
    ("content", where the model takes it mid-session) or `realtimeInput.text` ("text")."""
    call_id: str
    via: Literal["tool_response", "content", "text"]
    part: int = 0


@dataclass(frozen=True)
class ApplyContext:
    """Send the in-session settings as of log version `version` as a `contextUpdate`: the
    live model state lacks them (a change made now, or a session resumed from a handle
    older than the change, or a takeover)."""
    version: int


@dataclass(frozen=True)
class SendConversation:
    """Tell a resumed session, as content, the turns the log has that its handle's state
    lacks (up to log version `through`), where the model takes clientContent mid-session."""
    through: int


@dataclass(frozen=True)
class TellCut:
    """Tell the live session what the caller heard of the turn cut at log version `cut`
    (cut_notes.py): `via` "content" (a clientContent note that starts no reply), or
    "reseed" where its generation takes no such note (the session is replaced, at the next
    safe point, by a fresh one seeded from the log, which holds the heard part)."""
    cut: int
    via: Literal["content", "reseed"]


@dataclass(frozen=True)
class Reconnect:
    reason: str


Effect = (StartCall | ResolveInDoubt | CheckOutcome | SendResult | ApplyContext
          | SendConversation | TellCut | Reconnect)

#: The reconnect a send that failed on a live socket asks for (decide.SendFailed): that
#: socket cannot be trusted with the next send, so it is replaced at once, not after the turn.
SEND_FAILED = "send_failed"

OUTCOME_UNKNOWN = ("outcome unknown: the system was interrupted while this tool was running; "
                   "it may or may not have taken effect. Check before retrying.")


def idempotency_key(state: SessionState, call: CallState) -> str:
    return call.idempotency_key or f"{state.stream_id}:{call.call_id}"


def due(state: SessionState, policy: Policy, now_us: int) -> list[Effect]:
    """Everything that should happen now, in the order it should happen."""
    if state.closed:
        return []
    effects: list[Effect] = []
    for call in state.in_doubt():
        effects.append(_settle_in_doubt(state, call, policy))
    if state.connected:
        rules = state.rules
        if rules.context_update and lacks_context(state) and not _under_way(
                state.context_sends, state.generation):
            # In order with the rest of the input (google-genai's send_context_update): it
            # does not cut the model off, so it goes at once, before any result.
            effects.append(ApplyContext(state.context_version))
        catch_up = _conversation_to_send(state)
        if catch_up is not None and not state.bot_speaking:
            effects.append(SendConversation(catch_up))  # content: waits for silence
        for note in cut_notes.owed(state):
            # Before any result: the model should answer knowing what was heard. Content
            # waits for silence (it would cut a generation under way); the cut stopped it.
            if rules.cut_note is None:
                effects.append(TellCut(note.cut, "reseed"))
            elif not state.bot_speaking:
                effects.append(TellCut(note.cut, rules.cut_note))
        busy: set[str] = set()  # calls with a part on its way: their next part waits
        for call, part in undelivered_parts(state):
            if call.call_id in busy:
                continue
            busy.add(call.call_id)
            if any(not s.confirmed and s.generation == state.generation
                   for s in call.sends_of(part)):
                continue  # a send on this session is under way
            via = _delivery_channel(state, call)
            if via != "tool_response" and state.bot_speaking:
                # Content interrupts the model's generation under way (google-genai's
                # LiveClientContent): it waits for silence, as a deferred call does. A
                # toolResponse does not (the model asked for it).
                continue
            effects.append(SendResult(call.call_id, via, part))
    # I4: nothing deferrable starts while the bot speaks, even a call recorded as "requested"
    # (it arrived in silence, and the bot started speaking before it was started).
    waiting_calls = _waiting_calls(state)
    for call in waiting_calls:
        if not (state.bot_speaking and (call.status == "deferred"
                                        or policy.defers(call.name, call.mode))):
            effects.append(StartCall(call.call_id, 1, idempotency_key(state, call)))
    reconnect = reconnect_due(state, policy, now_us, waiting=bool(waiting_calls))
    if reconnect is not None:
        effects.append(reconnect)
    return effects


def reconnect_due(state: SessionState, policy: Policy, now_us: int, *,
                  waiting: bool | None = None) -> Reconnect | None:
    """The reconnect due now, if any: no live session, or one pending (a goAway, new
    settings, a failed send, a resync) whose safe point has come. Asked by `due`, and again
    by decide.SessionLeft on the state a planned leave is logged on. `waiting`: whether
    calls wait to start (`due` knows already)."""
    if waiting is None:
        waiting = bool(_waiting_calls(state))
    deadline_near = (state.go_away_deadline_us is not None and now_us
                     >= state.go_away_deadline_us - int(policy.go_away_margin_s * 1e6))
    # Once the connection is given up (decide.gives_up) the shell stops: no reconnect.
    if state.opened and not state.given_up and (not state.connected or state.reconnect_pending):
        reason = state.reconnect_pending or ("takeover" if state.takeovers else "connection_lost")
        if (not state.connected or deadline_near or (state.idle and not waiting)
                or reason == SEND_FAILED):
            return Reconnect(reason)
    return None


def _settle_in_doubt(state: SessionState, call: CallState, policy: Policy) -> Effect:
    """An idempotent tool runs again with its key; a tool with an outcome check is asked
    first (still in doubt after "not done": the tool allowed a re-run, outcomes.py); any
    other is answered "outcome unknown"."""
    key = idempotency_key(state, call)
    if policy.is_idempotent(call.name) or call.checked == "not_done":
        return StartCall(call.call_id, call.attempt + 1, key)
    if policy.checks(call.name) and call.checked is None:
        return CheckOutcome(call.call_id, key)
    return ResolveInDoubt(call.call_id)


def _under_way(covers, generation: int) -> bool:
    return any(not c.confirmed and c.generation == generation for c in covers)


def _conversation_to_send(state: SessionState) -> int | None:
    """The log version up to which a resumed session must be told the turns it lacks, or
    None. Only where the model takes clientContent mid-session; elsewhere a handle that lacks
    turns is not resumed from (choose_resumption). A fresh session gets its seed instead."""
    current = state.generations.get(state.generation)
    if (current is None or current.handle is None or not state.rules.client_content_mid_session
            or _under_way(state.conversation_sends, state.generation)):
        return None
    missing = unheld_messages(state) + [state.calls[c].requested_version
                                        for c in unheld_calls(state)]
    return max(missing) if missing else None


def _waiting_calls(state: SessionState) -> list:
    """Calls asked for and not started yet (requested or deferred), in request order."""
    return [c for c in state.calls.values() if c.status in ("requested", "deferred")]


def waits_for_silence(state: SessionState) -> bool:
    """Does anything wait for the bot to stop speaking (a deferred call, a pending
    reconnect, a result or turns to send as content)? Then news that it stopped must be
    logged at once; otherwise it may wait to share the next commit."""
    return (state.reconnect_pending is not None or bool(_waiting_calls(state))
            or (state.connected and (
                _conversation_to_send(state) is not None or bool(cut_notes.owed(state))
                or any(_delivery_channel(state, c) != "tool_response"
                       for c, _part in undelivered_parts(state)))))


def waits_for_idle(state: SessionState) -> bool:
    """Does anything wait for a model that reports interaction_status to say IDLE (a
    pending reconnect)? Then that status must be logged at once."""
    return state.reconnect_pending is not None and state.rules.interaction_status


def _delivery_channel(state: SessionState, call) -> Literal["tool_response", "content", "text"]:
    """A toolResponse only to a session that issued the call's id; otherwise content, by
    the channel the model takes mid-session."""
    if session_knows_call(state, call):
        return "tool_response"
    return "content" if state.rules.client_content_mid_session else "text"


def choose_resumption(state: SessionState, policy: Policy, now_us: int,
                      exclude=frozenset()) -> str | None:
    """The handle a new session should resume from, or None for a fresh, seeded session.

    The newest persisted handle younger than its TTL whose state cannot hold any send whose
    success is unconfirmed (issued before it in its lineage, or in another lineage): that state
    provably lacks those results, so sending them again is exactly once. Its state must also
    be one the model can be brought up to date from: where the model takes no contextUpdate,
    it must hold the current system instruction and tools (a resumed session is not known to
    adopt new ones from its setup); where it takes no clientContent mid-session, it must hold
    every logged turn and tool exchange. It must not hold a bot turn whole that the caller
    heard only part of (the log's cut turns): a fresh session is seeded with the heard
    part. Handles the server refused (HandleRefused), and
    those in `exclude`, are passed over for an older one. `policy.resumption` may rule
    resumption out (see Policy).
    """
    if not resumption_allowed(state, policy):
        return None
    rules = state.rules
    unsure = unconfirmed(state)
    best = None
    for h in state.handles.values():
        if (now_us - h.issued_at_us > policy.handle_ttl_us or h.refused
                or h.handle in exclude):
            continue
        if best is not None and h.version <= best.version:
            continue
        if any(handle_may_hold(state, h, s) for s in unsure):
            continue
        if holds_cut_turn(state, h):  # the model would take the unheard rest as said
            continue
        if not rules.context_update and lacks_context(state, h):
            continue
        if not rules.client_content_mid_session and (unheld_messages(state, h)
                                                     or unheld_calls(state, h)):
            continue
        best = h
    return best.handle if best else None


def resumption_allowed(state: SessionState, policy: Policy) -> bool:
    if policy.resumption == "avoid":
        return False
    if policy.resumption == "prefer":
        return True
    limit = state.rules.resumption_prompt_token_limit
    prompt = state.settings.get("system_instruction")
    return limit is None or not isinstance(prompt, str) or prompt_tokens(prompt) <= limit


@dataclass(frozen=True)
class SeedPlan:
    """What a fresh session is seeded with: (role, text) turns in log order, the results it
    delivers ((call id, part): part 0 an outcome, n an intermediate result), the log version
    of the last turn it covers, and whether it carries a result no model state saved by a
    handle ever held (no model has been seen to take it in: the seed asks for an answer)."""
    turns: list[tuple[str, str]]
    parts: list[tuple[str, int]]
    through: int
    unanswered: bool = False


def seed_plan(state: SessionState) -> SeedPlan:
    """The conversation a fresh session is seeded with, rebuilt from the log.

    Each call with an outcome appears once, with its function name and its result verbatim
    (JSON), so seeding delivers it exactly once; a call still running (or waiting to) appears
    as asked for, with its intermediate results so far, so the model waits for its result
    rather than asking again (the caller heard it announced); cancelled calls are left out.
    Needs the whole history: raises HistoryNeeded on a compacted state.
    """
    state.require_history()
    turns: list[tuple[str, str]] = []
    parts: list[tuple[str, int]] = []
    through = max((v for v, _g in state.message_marks), default=0)
    for role, text in state.conversation:
        if role != "tool":
            turns.append((role, text))
            continue
        call = state.calls[text]
        if call.status == "cancelled" or (call.superseded_by and not call.has_outcome):
            continue
        turns.append(called_as_content(call))
        through = max(through, call.requested_version)
        if call.has_outcome:
            turns.append(("user", result_as_content(call)))
            parts.append((call.call_id, 0))
            continue
        for p in call.progress:
            turns.append(("user", result_as_content(call, p.part)))
            parts.append((call.call_id, p.part))
    # A handle is logged as issued only once the model reacted to what was sent before it
    # (HandleWithheld): a result some handle's state holds was taken in by a model.
    lineages = [lineage_cutoffs(state, h) for h in state.handles.values()]
    unanswered = any(not any(send_held(lineage, send) for lineage in lineages
                             for send in state.calls[cid].sends_of(part))
                     for cid, part in parts)
    return SeedPlan(turns, parts, through, unanswered)


def seed_history(state: SessionState) -> list[tuple[str, str]]:
    """The turns of `seed_plan` (see there)."""
    return seed_plan(state).turns


def catch_up_turns(state: SessionState, through: int) -> list[tuple[str, str]]:
    """The logged turns (role, text) the current model state lacks, up to log version
    `through`, in log order (SendConversation). Needs the whole history."""
    state.require_history()
    missing = {v for v in unheld_messages(state) if v <= through}
    calls = {c for c in unheld_calls(state) if state.calls[c].requested_version <= through}
    marks = iter(state.message_marks)
    turns = []
    for role, text in state.conversation:
        if role == "tool":
            if text in calls:  # its result, if any, goes on its own (SendResult)
                turns.append(called_as_content(state.calls[text]))
        elif next(marks)[0] in missing:
            turns.append((role, text))
    return turns


def called_as_content(call: CallState) -> tuple[str, str]:
    """A tool call the model asked for, as a model turn of a seed or catch-up."""
    return ("assistant", f"[Called function {call.name} with args "
                         f"{json.dumps(call.args, sort_keys=True)}]")


def result_value(call: CallState, part: int = 0) -> Any:
    if part:
        return call.progress[part - 1].result
    if call.status == "completed":
        return call.result
    return {"error": call.error, "outcome_unknown": call.outcome_unknown}


def result_scheduling(call: CallState, part: int = 0, rules: ModelRules | None = None
                      ) -> str | None:
    """How a NON_BLOCKING call's response is scheduled: None for a blocking call, or where
    the model refuses the field (`rules`)."""
    if call.mode != "non_blocking" or (rules is not None and not rules.response_scheduling):
        return None
    chosen = call.progress[part - 1].scheduling if part else call.scheduling
    return chosen or "WHEN_IDLE"


def result_as_content(call: CallState, part: int = 0) -> str:
    """How a result is told to a session that never issued the call: name and value verbatim
    (an intermediate result says it is one)."""
    verb = "reported progress" if part else "returned"
    return (f"[Function {call.name} (call_id {call.call_id}) {verb} "
            f"{json.dumps(result_value(call, part), sort_keys=True)}]")
