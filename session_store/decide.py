"""Decisions, as pure functions of the projected state.

`decide(state, observation, policy)` turns what the shell observed into the events to append
(write-ahead: the shell appends them before acting). `due(state, policy, now_us)` says what
must happen now. Live operation and crash recovery run the same two functions: after a
takeover the state simply has in-doubt calls, undelivered results and no live session.
"""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass, field
from typing import Any, Literal

from . import events as ev
from .checks import check_count, check_seconds
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
    #: A call whose arguments exceed this (canonical JSON, UTF-8 bytes) is not run: it is
    #: recorded with a bounded stand-in for its arguments and answered with an explicit
    #: error. 1 MiB is google-genai's default websocket frame limit, so no stock client ever
    #: ran anything larger; a 1 MB event appends in ~10-50 ms (bench/huge_args.py).
    max_args_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        # Checked here, once: a typo (defer="lookup_order", a string, not a set of names)
        # otherwise deferred nothing, silently, and idempotent="lookup_order" matched
        # every tool whose name is a substring of it.
        for name in ("defer", "reuse_equivalent", "idempotent"):
            object.__setattr__(self, name, _tool_names(name, getattr(self, name),
                                                       modes=name != "idempotent"))
        for name in ("crossing_window_s", "go_away_margin_s"):
            check_seconds(f"Policy.{name}", getattr(self, name), zero_ok=True)
        for name in ("handle_ttl_us", "max_args_bytes"):
            check_count(f"Policy.{name}", getattr(self, name))

    def defers(self, name: str) -> bool:
        return self.defer == "all" or (not isinstance(self.defer, str) and name in self.defer)

    def reuses(self, name: str) -> bool:
        return self.reuse_equivalent == "all" or (
            not isinstance(self.reuse_equivalent, str) and name in self.reuse_equivalent)

    def is_idempotent(self, name: str) -> bool:
        return name in self.idempotent


def _tool_names(field_name: str, value: Any, *, modes: bool) -> Any:
    """"all", "none" (where `modes`) or a frozenset of tool names, from any collection."""
    choices = "'all', 'none' or a set of tool names" if modes else "a set of tool names"
    if isinstance(value, str):
        if modes and value in ("all", "none"):
            return value
        raise ValueError(f"Policy.{field_name} must be {choices}, not the string {value!r} "
                         f"(for one tool: {{{value!r}}})")
    try:
        names = frozenset(value)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise ValueError(f"Policy.{field_name} must be {choices}, not {value!r:.80}")
    return names


# --------------------------------------------------------------------------- observations

@dataclass(frozen=True)
class FunctionCall:
    call_id: str | None
    name: str | None
    args: Any
    #: The server sent no id; `call_id` was made up by the shell (Vertex never sends ids;
    #: the Gemini API always should, so there it is an anomaly, still run and answered).
    id_generated: bool = False
    #: A handler (or a catch-all) is registered for `name` in the shell.
    has_handler: bool = True


@dataclass(frozen=True)
class ToolCallsArrived:
    calls: tuple[FunctionCall, ...]
    generation: int


@dataclass(frozen=True)
class ServerMessageRejected:
    """A server message the shell could not take in (see RESYNC_KINDS); `detail` bounded."""
    kind: str
    detail: dict[str, Any]
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
               | SettingsUpdate | CancellationArrived | GoAway | ServerMessageRejected)

#: Rejected server messages after which this session's state may differ from the model's (the
#: message may have been a toolCall, a handle, a goAway ...): the session is replaced, by the
#: same rules as a settings change (after the turn; the handle the log allows), so both sides
#: continue from a state the log knows. Other kinds (an unknown message type) are only logged.
RESYNC_KINDS = frozenset({"malformed_message", "server_error_message",
                          "message_handling_failed"})

NO_NAME_ERROR = "the function call had no name: nothing was run"


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
        case ServerMessageRejected():
            out = [ev.AnomalyRecorded(obs.kind, bounded(obs.detail), obs.generation)]
            # Only for the live session: one from a session already left needs nothing more.
            if (obs.kind in RESYNC_KINDS and state.connected and obs.generation == state.generation
                    and not state.reconnect_pending):
                out.append(ev.ReconnectRequested(obs.kind))
            return out
    raise TypeError(f"unknown observation {obs!r}")


def _decide_tool_calls(state: SessionState, obs: ToolCallsArrived, policy: Policy
                       ) -> list[ev.Event]:
    """Record each call and what to do about it. Every call the server can be answered for is
    recorded and ends answered (I1): a call that cannot run (no name, no such tool, arguments
    too large or not valid JSON) fails at once with an explicit error, which the delivery
    rules send like any result. What cannot be answered is logged instead: a call with
    neither id nor name (nothing to address an answer to), a repeated id (answering it would
    answer that id twice, running it would run one request twice), and an id or name that is
    not valid text (it cannot be stored, so not answered either: the session is resynced)."""
    out: list[ev.Event] = []
    seen: set[str] = set()
    for call in obs.calls:
        gen = obs.generation
        name = call.name if isinstance(call.name, str) else ""
        if not name and (call.id_generated or not call.call_id):
            out.append(ev.AnomalyRecorded("tool_call_without_name",
                                          {"call_id": None, "args": _preview(call.args)}, gen))
            continue
        if not call.call_id or not isinstance(call.call_id, str):  # the shell always makes one
            out.append(ev.AnomalyRecorded("tool_call_without_id",
                                          {"name": _clean(name), "args": _preview(call.args)},
                                          gen))
            continue
        if not (_is_text(call.call_id) and _is_text(name)):
            out += decide(state, ServerMessageRejected("malformed_message", {
                "what": "a function call whose id or name is not valid text",
                "call_id": _clean(call.call_id), "name": _clean(name)}, gen), policy)
            continue
        if call.id_generated:
            out.append(ev.AnomalyRecorded("tool_call_without_id",
                                          {"call_id": call.call_id, "name": name}, gen))
        if state.knows_call_id(call.call_id) or call.call_id in seen:
            # (Where the first one is: nothing about it that a compacted state may not know.)
            out.append(ev.AnomalyRecorded("duplicate_tool_call_id", {
                "call_id": call.call_id, "name": name,
                "first": "same_tool_call" if call.call_id in seen else "earlier_call",
                "args": _preview(call.args)}, gen))
            continue
        seen.add(call.call_id)
        args, size = _storable_args(call.args)
        out.append(ev.ToolCallRequested(call.call_id, name, args, gen))
        refused = None
        if not name:
            refused = ("tool_call_without_name", {"call_id": call.call_id}, NO_NAME_ERROR)
        elif size is None:
            refused = ("invalid_tool_args", {"call_id": call.call_id, "name": name,
                                             "args": args["_invalid"]},
                       "the arguments are not valid JSON (NaN, or text that is not "
                       "valid Unicode): nothing was run")
        elif size > policy.max_args_bytes:
            args = {"_omitted_bytes": size, "_preview": _preview(args)}
            out[-1] = ev.ToolCallRequested(call.call_id, name, args, gen)
            refused = ("tool_args_too_large",
                       {"call_id": call.call_id, "name": name, "bytes": size,
                        "limit": policy.max_args_bytes},
                       f"the arguments are too large ({size} bytes; the limit is "
                       f"{policy.max_args_bytes}): nothing was run")
        elif not call.has_handler:
            refused = ("unknown_tool", {"call_id": call.call_id, "name": name},
                       f"no function named {name!r} is available: nothing was run")
        if refused is not None:
            kind, detail, error = refused
            out += [ev.AnomalyRecorded(kind, detail, gen), ev.ToolCallFailed(call.call_id, error)]
            continue
        earlier = (state.find_equivalent(name, args, int(policy.crossing_window_s * 1e6))
                   if policy.reuses(name) else None)
        if earlier is not None and earlier.status == "completed":
            # Gemini re-asked after resuming from a state that lost the first answer.
            out.append(ev.ToolCallCompleted(call.call_id, earlier.result,
                                            reused_from=earlier.call_id))
        elif earlier is not None:
            # The original has no delivered answer yet (deferred, running, in doubt after a
            # crash, or failed): link them; the tool never runs twice for one request.
            out.append(ev.ToolCallReissued(call.call_id, earlier.call_id))
        elif state.bot_speaking and policy.defers(name):
            out.append(ev.ToolCallDeferred(call.call_id))
    return out


def _storable_args(args: Any) -> tuple[dict[str, Any], int | None]:
    """The arguments as the log will keep them, and their size in bytes (canonical JSON).
    Size None: they cannot be stored as JSON at all (NaN, a lone surrogate: the SDK lets
    both through); the stand-in then shows their start, escaped."""
    value = args if isinstance(args, dict) else {"_value": _jsonable(args)}
    try:
        return value, len(ev.canonical_json(value).encode())
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return {"_invalid": _preview(value)}, None


PREVIEW_CHARS = 200


def _is_text(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _clean(text: str) -> str:
    """Text that can be stored: a lone surrogate becomes its escape sequence."""
    return text if _is_text(text) else text.encode("utf-8", "backslashreplace").decode()


def _preview(value: Any) -> str:
    """The start of a value's JSON, for an anomaly's details (never the whole of a huge one)."""
    try:
        text = ev.canonical_json(value)
    except (TypeError, ValueError):
        try:
            text = repr(value)
        except RecursionError:  # nested past Python's limit: the start of it will do
            text = reprlib.repr(value)
    text = _clean(text)
    return text if len(text) <= PREVIEW_CHARS else f"{text[:PREVIEW_CHARS]}… ({len(text)} chars)"


def bounded(detail: Any, depth: int = 0) -> Any:
    """An anomaly's details made storable and small: strings, lists and mappings cut to a few
    hundred chars / items, text that is not valid Unicode escaped, NaN spelled out. What a
    hostile server sends must neither bloat the log nor make an append fail."""
    if isinstance(detail, str):
        detail = _clean(detail)
        return detail if len(detail) <= 300 else f"{detail[:300]}… ({len(detail)} chars)"
    if isinstance(detail, float) and not math.isfinite(detail):
        return repr(detail)
    if depth >= 4 and isinstance(detail, (dict, list, tuple)):
        return _preview(detail)
    if isinstance(detail, dict):
        items = list(detail.items())
        out = {_clean(str(k))[:100]: bounded(v, depth + 1) for k, v in items[:20]}
        if len(items) > 20:
            out["_more_keys"] = len(items) - 20
        return out
    if isinstance(detail, (list, tuple)):
        return [bounded(v, depth + 1) for v in detail[:20]] + (
            [f"… ({len(detail) - 20} more)"] if len(detail) > 20 else [])
    return _jsonable(detail)


def _decide_cancellation(state: SessionState, obs: CancellationArrived) -> list[ev.Event]:
    out: list[ev.Event] = []
    cancelled: set[str] = set()
    for call_id in obs.call_ids:
        call = state.calls.get(call_id)
        if call_id in state.archived:
            continue  # answered (or cancelled) for good: nothing left to cancel
        if call is None:
            out.append(ev.AnomalyRecorded("cancellation_for_unknown_call",
                                          {"call_id": _clean(str(call_id))}, obs.generation))
        elif (call.status != "cancelled" and call_id not in cancelled
              and not (call.has_outcome and state.in_model(call))):
            out.append(ev.ToolCallCancelled(call_id, "server"))
            cancelled.add(call_id)
            # A re-issued id stands for its original (the model lost the first id): the
            # request is cancelled, so the original must not start (or go on) for it.
            for original in cancelled_with(state, (call_id,))[1:]:
                if (original.status != "cancelled" and not original.has_outcome
                        and original.call_id not in cancelled):
                    out.append(ev.ToolCallCancelled(original.call_id, "reissue_cancelled"))
                    cancelled.add(original.call_id)
    return out


def cancelled_with(state: SessionState, call_ids) -> list[CallState]:
    """The calls a cancellation of these ids reaches: each known call, then the originals
    it re-asks for (`reissue_of`, transitively), in that order, each once."""
    found: list[CallState] = []
    seen: set[str] = set()
    for call_id in call_ids:
        call = state.calls.get(call_id) if isinstance(call_id, str) else None
        while call is not None and call.call_id not in seen:
            seen.add(call.call_id)
            found.append(call)
            call = state.calls.get(call.reissue_of) if call.reissue_of else None
    return found


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
            via = _delivery_channel(state, call)
            if via == "content" and state.bot_speaking:
                # Content interrupts the model's generation under way (google-genai's
                # LiveClientContent): it waits for silence, as a deferred call does. A
                # toolResponse does not (the model asked for it).
                continue
            effects.append(SendResult(call.call_id, via))
    # I4: nothing deferrable starts while the bot speaks, even a call recorded as "requested"
    # (it arrived in silence, and the bot started speaking before it was started).
    waiting_calls = _waiting_calls(state)
    for call in waiting_calls:
        if not (state.bot_speaking and (call.status == "deferred" or policy.defers(call.name))):
            effects.append(StartCall(call.call_id, 1, idempotency_key(state, call)))
    waiting = bool(waiting_calls)
    deadline_near = (state.go_away_deadline_us is not None and now_us
                     >= state.go_away_deadline_us - int(policy.go_away_margin_s * 1e6))
    if state.opened and (not state.connected or state.reconnect_pending):
        reason = state.reconnect_pending or ("takeover" if state.takeovers else "connection_lost")
        if not state.connected or deadline_near or (not state.bot_speaking and not waiting):
            effects.append(Reconnect(reason))
    return effects


def _waiting_calls(state: SessionState) -> list:
    """Calls asked for and not started yet (requested or deferred), in request order."""
    return [c for c in state.calls.values() if c.status in ("requested", "deferred")]


def waits_for_silence(state: SessionState) -> bool:
    """Does anything wait for the bot to stop speaking (a deferred call, a pending
    reconnect, a result to send as content)? Then news that it stopped must be logged at
    once; otherwise it may wait to share the next commit."""
    return (state.reconnect_pending is not None or bool(_waiting_calls(state))
            or (state.connected and any(_delivery_channel(state, c) == "content"
                                        for c in state.undelivered())))


def _delivery_channel(state: SessionState, call) -> Literal["tool_response", "content"]:
    """A toolResponse only to a session that issued the call's id; otherwise content."""
    return "tool_response" if state.session_knows_call(call) else "content"


def choose_resumption(state: SessionState, policy: Policy, now_us: int,
                      exclude=frozenset()) -> str | None:
    """The handle a new session should resume from, or None for a fresh, seeded session.

    The newest persisted handle younger than its TTL whose state cannot hold any send whose
    success is unconfirmed (issued before it in its lineage, or in another lineage): that state
    provably lacks those results, so sending them again is exactly once. Handles in
    `exclude` (the server refused them) are passed over for an older one.
    """
    unconfirmed = [s for _c, s in state.unconfirmed_sends()]
    best = None
    for h in state.handles.values():
        if now_us - h.issued_at_us > policy.handle_ttl_us or h.handle in exclude:
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
