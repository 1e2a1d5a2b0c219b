"""Decisions, as pure functions of the projected state.

`decide(state, observation, policy)` turns what the shell observed into the events to append
(write-ahead: the shell appends them before acting). `due(state, policy, now_us)` says what
must happen now. Live operation and crash recovery run the same two functions: after a
takeover the state simply has in-doubt calls, undelivered results and no live session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from . import events as ev
from .projection import HANDLE_TTL_US, CallState, SessionState


# --------------------------------------------------------------------------- policy

@dataclass(frozen=True)
class Policy:
    """How the service treats tools. Sets name tools; "all"/"none" mean every/no tool."""

    defer: Literal["all", "none"] | frozenset[str] = "all"
    idempotent: frozenset[str] = frozenset()
    #: Answer a re-issued equivalent call (same name and args) from the recorded result.
    reuse_equivalent: Literal["all", "none"] | frozenset[str] = "all"
    #: A repeat of a call answered as content this recently is taken as a re-ask that
    #: crossed the answer on the wire, and answered from the record.
    crossing_window_s: float = 10.0
    #: Reconnect this long before a goAway deadline even if the bot is still speaking.
    go_away_margin_s: float = 5.0
    handle_ttl_us: int = HANDLE_TTL_US

    def defers(self, name: str) -> bool:
        return self.defer == "all" or (not isinstance(self.defer, str) and name in self.defer)

    def reuses(self, name: str) -> bool:
        return self.reuse_equivalent == "all" or (
            not isinstance(self.reuse_equivalent, str) and name in self.reuse_equivalent)

    def is_idempotent(self, name: str) -> bool:
        return name in self.idempotent


# --------------------------------------------------------------------------- observations

@dataclass(frozen=True)
class FunctionCall:
    call_id: str | None
    name: str | None
    args: Any


@dataclass(frozen=True)
class ToolCallsArrived:
    calls: tuple[FunctionCall, ...]
    generation: int


@dataclass(frozen=True)
class SpeechStarted:
    generation: int
    source: str = "model"


@dataclass(frozen=True)
class SpeechStopped:
    generation: int
    source: str = "turn_complete"


@dataclass(frozen=True)
class InterruptionObserved:
    generation: int


@dataclass(frozen=True)
class SettingsUpdate:
    keys: tuple[str, ...]
    values: dict[str, Any] = field(default_factory=dict)  # already redacted by the shell
    needs_reconnect: bool = False


@dataclass(frozen=True)
class CancellationArrived:
    call_ids: tuple[str, ...]
    generation: int


@dataclass(frozen=True)
class GoAway:
    generation: int
    time_left_s: float


Observation = (ToolCallsArrived | SpeechStarted | SpeechStopped | InterruptionObserved
               | SettingsUpdate | CancellationArrived | GoAway)


def decide(state: SessionState, obs: Observation, policy: Policy) -> list[ev.Event]:
    """The events that record `obs` and what was decided about it."""
    if state.closed:
        return []  # the call is over: late signals (audio still draining) change nothing
    match obs:
        case ToolCallsArrived():
            return _decide_tool_calls(state, obs, policy)
        case SpeechStarted():
            return [] if state.bot_speaking else [ev.BotStartedSpeaking(obs.generation, obs.source)]
        case SpeechStopped():
            return [ev.BotStoppedSpeaking(obs.generation, obs.source)] if state.bot_speaking else []
        case InterruptionObserved():
            return [ev.Interrupted(obs.generation)]
        case SettingsUpdate():
            out: list[ev.Event] = [ev.SettingsChanged(list(obs.keys), dict(obs.values),
                                                      obs.needs_reconnect)]
            if obs.needs_reconnect:
                out.append(ev.ReconnectRequested("settings", list(obs.keys)))
            return out
        case CancellationArrived():
            return _decide_cancellation(state, obs)
        case GoAway():
            return [ev.GoAwayReceived(obs.generation, obs.time_left_s)]
    raise TypeError(f"unknown observation {obs!r}")


def _decide_tool_calls(state: SessionState, obs: ToolCallsArrived, policy: Policy
                       ) -> list[ev.Event]:
    out: list[ev.Event] = []
    seen: set[str] = set()
    for call in obs.calls:
        if not call.name or not isinstance(call.name, str):
            out.append(ev.AnomalyRecorded("tool_call_without_name",
                                          {"call_id": call.call_id, "args": _jsonable(call.args)},
                                          obs.generation))
            continue
        if not call.call_id or not isinstance(call.call_id, str):
            out.append(ev.AnomalyRecorded("tool_call_without_id",
                                          {"name": call.name, "args": _jsonable(call.args)},
                                          obs.generation))
            continue
        if state.knows_call_id(call.call_id) or call.call_id in seen:
            out.append(ev.AnomalyRecorded("duplicate_tool_call_id",
                                          {"call_id": call.call_id, "name": call.name},
                                          obs.generation))
            continue
        seen.add(call.call_id)
        args = call.args if isinstance(call.args, dict) else {"_value": _jsonable(call.args)}
        out.append(ev.ToolCallRequested(call.call_id, call.name, args, obs.generation))
        earlier = (state.find_equivalent(call.name, args, int(policy.crossing_window_s * 1e6))
                   if policy.reuses(call.name) else None)
        if earlier is not None and earlier.status == "completed":
            # Gemini re-asked after resuming from a state that lost the first answer.
            out.append(ev.ToolCallCompleted(call.call_id, earlier.result,
                                            reused_from=earlier.call_id))
        elif earlier is not None:
            # The original has no delivered answer yet (deferred, running, in doubt after a
            # crash, or failed): link them; the tool never runs twice for one request.
            out.append(ev.ToolCallReissued(call.call_id, earlier.call_id))
        elif state.bot_speaking and policy.defers(call.name):
            out.append(ev.ToolCallDeferred(call.call_id))
    return out


def _decide_cancellation(state: SessionState, obs: CancellationArrived) -> list[ev.Event]:
    out: list[ev.Event] = []
    for call_id in obs.call_ids:
        call = state.calls.get(call_id)
        if call_id in state.archived:
            continue  # answered (or cancelled) for good: nothing left to cancel
        if call is None:
            out.append(ev.AnomalyRecorded("cancellation_for_unknown_call", {"call_id": call_id},
                                          obs.generation))
        elif call.status != "cancelled" and not (call.has_outcome and state.in_model(call)):
            out.append(ev.ToolCallCancelled(call_id, "server"))
    return out


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool, list, dict)):
        return value
    return repr(value)


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
class SendResult:
    call_id: str
    via: Literal["tool_response", "content"]


@dataclass(frozen=True)
class Reconnect:
    reason: str


Effect = StartCall | ResolveInDoubt | SendResult | Reconnect

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
        if policy.is_idempotent(call.name):
            effects.append(StartCall(call.call_id, call.attempt + 1, idempotency_key(state, call)))
        else:
            effects.append(ResolveInDoubt(call.call_id))
    if state.connected:
        for call in state.undelivered():
            if any(not s.confirmed and s.generation == state.generation for s in call.sends):
                continue  # a send on this session is under way
            via = "tool_response" if state.session_knows_call(call) else "content"
            effects.append(SendResult(call.call_id, via))
    # I4: nothing deferrable starts while the bot speaks, even a call recorded as "requested"
    # (it arrived in silence, and the bot started speaking before it was started).
    to_start = [c for c in state.calls.values() if c.status in ("requested", "deferred")
                and not (state.bot_speaking and (c.status == "deferred" or policy.defers(c.name)))]
    for call in to_start:
        effects.append(StartCall(call.call_id, 1, idempotency_key(state, call)))
    waiting = any(c.status in ("requested", "deferred") for c in state.calls.values())
    deadline_near = (state.go_away_deadline_us is not None and now_us
                     >= state.go_away_deadline_us - int(policy.go_away_margin_s * 1e6))
    if state.opened and (not state.connected or state.reconnect_pending):
        reason = state.reconnect_pending or ("takeover" if state.takeovers else "connection_lost")
        if not state.connected or deadline_near or (not state.bot_speaking and not waiting):
            effects.append(Reconnect(reason))
    return effects


def choose_resumption(state: SessionState, policy: Policy, now_us: int) -> str | None:
    """The handle a new session should resume from, or None for a fresh, seeded session.

    The newest persisted handle younger than its TTL whose state cannot hold any send whose
    success is unconfirmed (issued before it in its lineage, or in another lineage): that state
    provably lacks those results, so sending them again is exactly once.
    """
    unconfirmed = [s for _c, s in state.unconfirmed_sends()]
    best = None
    for h in state.handles.values():
        if now_us - h.issued_at_us > policy.handle_ttl_us:
            continue
        if any(state.handle_may_hold(h, s) for s in unconfirmed):
            continue
        if best is None or h.version > best.version:
            best = h
    return best.handle if best else None


def seed_history(state: SessionState) -> list[tuple[str, str]]:
    """The conversation a fresh session is seeded with: (role, text) turns in log order.

    Each call with an outcome appears once, with its function name and its result verbatim
    (JSON), so seeding delivers it exactly once; cancelled calls and calls still running are
    left out (their results are sent when they exist). Needs the whole history: raises
    HistoryNeeded on a compacted state.
    """
    state.require_history()
    turns: list[tuple[str, str]] = []
    for role, text in state.conversation:
        if role != "tool":
            turns.append((role, text))
            continue
        call = state.calls[text]
        if not call.has_outcome:
            continue
        turns.append(("assistant", f"[Called function {call.name} with args "
                                   f"{json.dumps(call.args, sort_keys=True)}]"))
        turns.append(("user", result_as_content(call)))
    return turns


def result_value(call: CallState) -> Any:
    if call.status == "completed":
        return call.result
    return {"error": call.error, "outcome_unknown": call.outcome_unknown}


def result_as_content(call: CallState) -> str:
    """How a result is told to a session that never issued the call: name and value verbatim."""
    return (f"[Function {call.name} (call_id {call.call_id}) returned "
            f"{json.dumps(result_value(call), sort_keys=True)}]")
