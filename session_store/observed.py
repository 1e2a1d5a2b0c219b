"""A decision's observation as the log keeps it (`decision.observed`), and read back: pure.

The driver logs each observation that decided something just before the events decided on
it, in the same commit, so `replay` decides again on exactly what the service decided on.
What those events already hold (a call's arguments, a result, settings values, a handle) is
referenced, not copied: the log does not grow by the size of its payloads. What the log
never keeps is not kept here either: arguments it refused (too large, not JSON) or stored
only as a preview (a repeated id) are logged as their size, and read back as stand-ins
that lead to the same decision; a rejected message's detail is the anomaly's, bounded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from . import events as ev
from .answers import wire_ids_naming
from .decide import (CancellationArrived, FunctionCall, GoAway, HandleArrived, HandshakeFailed,
                     InteractionStatusObserved,
                     InterruptionObserved, ModelOutputObserved, Observation, OutcomeAnswered,
                     ProgressReturned, ResultArrived, ResultReturned, SeedAsked, SendFailed,
                     ServerMessageRejected, SessionLeft, SessionReady,
                     SettingsUpdate, SpeechStarted, SpeechStopped, ToolCallsArrived,
                     TakenOver, ToolStopped, TranscriptFlushed)
from .outcomes import CannotTell, Done, NotAnAnswer, NotDone, done_unstorable
from .state import SessionState
from .storable import Unstorable, storable_args, why_unstorable

#: Every kind of observation, by the name `decision.observed` logs it under.
OBSERVATION_KINDS: dict[str, type] = {cls.__name__: cls for cls in (
    ToolCallsArrived, SpeechStarted, SpeechStopped, InterruptionObserved, SettingsUpdate,
    CancellationArrived, GoAway, ServerMessageRejected, InteractionStatusObserved,
    SessionReady, SessionLeft, HandshakeFailed, HandleArrived, ToolStopped, ResultReturned,
    ResultArrived, ProgressReturned, OutcomeAnswered, SendFailed, TranscriptFlushed,
    SeedAsked, ModelOutputObserved, TakenOver)}

_ANSWERS = {"done": Done, "not_done": NotDone, "cannot_tell": CannotTell,
            "not_an_answer": NotAnAnswer}


class Unreplayable(ValueError):
    """A logged observation that cannot be read back (withheld, or of an unknown kind)."""


def observation_record(obs: Observation, decided: Sequence[ev.Event],
                       state: SessionState) -> ev.ObservationRecorded:
    """The event that logs `obs`, decided into `decided` on `state` (as it was before)."""
    kind = type(obs).__name__
    refs: dict[str, list[Any]] = {}

    def ref(path: str, value: Any, etype: type[ev.Event], name: str | None) -> bool:
        for i, e in enumerate(decided):
            if isinstance(e, etype) and (e if name is None else getattr(e, name)) == value:
                refs[path] = [i, name]
                return True
        return False

    data = {f.name: getattr(obs, f.name) for f in dataclasses.fields(obs)}
    match obs:
        case ToolCallsArrived():
            data["calls"] = [_call(c, k, ref) for k, c in enumerate(obs.calls)]
        case SettingsUpdate():
            data["keys"] = list(obs.keys)
            if ref("values", obs.values, ev.SettingsChanged, "values"):
                data["values"] = None
        case SessionReady():
            if obs.handle is not None and ref("handle", obs.handle, ev.Connected, "handle"):
                data["handle"] = None
            if ref("prompt_sha256", obs.prompt_sha256, ev.Connected,
                   "system_instruction_sha256"):
                data["prompt_sha256"] = None
        case HandleArrived():
            # The handle (a secret the redactor masks in the event) is kept once.
            if ref("handle", obs.handle, ev.HandleIssued, "handle") or ref(
                    "handle", obs.handle, ev.HandleWithheld, "handle"):
                data["handle"] = None
            if obs.last_consumed_index is not None and ref(
                    "last_consumed_index", obs.last_consumed_index, ev.HandleIssued,
                    "last_consumed_client_message_index"):
                data["last_consumed_index"] = None
        case CancellationArrived():
            data["call_ids"] = list(obs.call_ids)
        case ToolStopped():
            data["wire_ids"] = wire_ids_naming(state, obs.call_id, obs.wire_ids)
        case ResultReturned():
            data["outcome"] = [None if ref(f"outcome.{k}", e, type(e), None)
                               else {"type": e.TYPE, "data": e.to_data()}
                               for k, e in enumerate(obs.outcome)]
        case ResultArrived():
            if not ref("value", obs.value, ev.ToolCallCompleted, "result"):
                _value_not_kept(obs, decided, data)
        case ProgressReturned():
            if not ref("value", obs.value, ev.ToolCallProgress, "result"):
                _value_not_kept(obs, decided, data)
        case OutcomeAnswered():
            data["answer"] = _answer(obs.call_id, obs.answer, ref)
        case TranscriptFlushed():
            # The caller's words stay in their pieces (when each arrived decides whether it
            # is late); the bot's, as the message decided on them says, is kept once.
            data["words"] = [list(w) for w in obs.words]
            if not obs.words:
                del data["words"]
            if obs.said and ref("said", obs.said, ev.ConversationMessage, "text"):
                data["said"] = None
        case ServerMessageRejected():
            # decide keeps it bounded: the anomaly's detail is all the log holds of it.
            anomaly = next((e for e in decided if isinstance(e, ev.AnomalyRecorded)
                            and e.kind == obs.kind), None)
            if anomaly is not None and ref("detail", anomaly.detail, ev.AnomalyRecorded,
                                           "detail"):
                data["detail"] = None
    _drop_referenced(data, refs)
    record = ev.ObservationRecorded(kind, _without_defaults(obs, data), len(decided), refs)
    problem = why_unstorable(record)
    if problem is not None:  # (text that is not valid Unicode from a hostile server)
        record = ev.ObservationRecorded(kind, {}, len(decided), {}, problem)
    return record


def _value_not_kept(obs: ResultArrived | ProgressReturned, decided: Sequence[ev.Event],
                    data: dict[str, Any]) -> None:
    """A tool's value that is not the call's next part: one the log cannot store (kept as
    the problem only: read back, an `Unstorable` leads to the same decision), or one whose
    call did not take it (an anomaly: the value decides nothing, it is not kept)."""
    data["value"] = None
    anomaly = next((e for e in decided if isinstance(e, ev.AnomalyRecorded)
                    and e.kind == "unstorable_event"), None)
    if anomaly is not None:
        data["unstorable"] = anomaly.detail["error"]


def _drop_referenced(data: dict[str, Any], refs: dict[str, list[Any]]) -> None:
    """A field that a reference fills in is not stored at all (an item of a list keeps its
    place, as None)."""
    for path in refs:
        *parents, last = path.split(".")
        holder: Any = data
        for step in parents:
            holder = holder[int(step)] if isinstance(holder, list) else holder[step]
        if isinstance(holder, dict):
            holder.pop(last, None)


def _without_defaults(obs: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Fields at their default value go unsaid: read back, the default fills them in."""
    defaults = {f.name: f.default for f in dataclasses.fields(obs)
                if f.default is not dataclasses.MISSING}
    return {k: v for k, v in data.items() if not (k in defaults and v == defaults[k]
                                                   and type(v) is type(defaults[k]))}


def _call(c: FunctionCall, k: int, ref) -> dict[str, Any]:
    out = _without_defaults(c, {"call_id": c.call_id, "name": c.name, "args": None,
                                "id_generated": c.id_generated, "has_handler": c.has_handler,
                                "declared": c.declared})
    args, size = storable_args(c.args)
    if size is None or not ref(f"calls.{k}.args", args, ev.ToolCallRequested, "args"):
        out["args_bytes"] = size  # not kept by the log: its size (None: not JSON) only
    return out


def _answer(call_id: str, answer, ref) -> dict[str, Any]:
    match answer:
        case Done():
            problem = done_unstorable(call_id, answer)
            if problem is not None:  # kept as the problem only (as an arriving result's)
                return {"answer": "done", "unstorable": problem}
            out: dict[str, Any] = {"answer": "done", "result": answer.result}
            if ref("answer.result", answer.result, ev.ToolCallCompleted, "result"):
                out["result"] = None
            return out
        case CannotTell():
            out = {"answer": "cannot_tell", "reason": answer.reason[:500]}
            if ref("answer.reason", answer.reason, ev.ToolOutcomeChecked, "detail"):
                out["reason"] = None
            return out
        case NotAnAnswer():
            return {"answer": "not_an_answer", "preview": answer.preview}  # (bounded)
    return {"answer": "not_done"}


def observation_of(record: ev.ObservationRecorded,
                   decided: Sequence[ev.Event]) -> tuple[Observation, frozenset[str]]:
    """The observation a `decision.observed` logged, rebuilt with the events decided on it;
    and the ids of calls whose arguments the log does not keep (they got stand-ins that
    lead to the same decision). Unreplayable if it was withheld or its kind is unknown."""
    cls = OBSERVATION_KINDS.get(record.kind)
    if record.withheld or cls is None:
        raise Unreplayable(record.withheld or f"unknown observation kind {record.kind!r}")
    data = _resolved(record, decided)
    not_logged: set[str] = set()
    try:
        match record.kind:
            case "ToolCallsArrived":
                calls = []
                for c in data["calls"]:
                    c = dict(c)
                    if "args_bytes" in c:
                        c["args"] = _stand_in(c.pop("args_bytes"))
                        if isinstance(c.get("call_id"), str):
                            not_logged.add(c["call_id"])
                    calls.append(FunctionCall(**c))
                data["calls"] = tuple(calls)
            case "SettingsUpdate":
                data["keys"] = tuple(data["keys"])
            case "CancellationArrived":
                data["call_ids"] = tuple(data["call_ids"])
            case "TranscriptFlushed":
                data["words"] = tuple((text, since) for text, since in data.get("words", ()))
            case "ToolStopped":
                data["wire_ids"] = frozenset(data["wire_ids"])
            case "ResultReturned":
                data["outcome"] = tuple(
                    x if isinstance(x, ev.Event) else ev.decode(x["type"], ev.catalogue()[x["type"]].SCHEMA,
                                                      x["data"])
                    for x in data["outcome"])
            case "ResultArrived" | "ProgressReturned":
                if "unstorable" in data:
                    data["value"] = Unstorable(data.pop("unstorable"))
            case "OutcomeAnswered":
                answer = dict(data["answer"])
                if "unstorable" in answer:
                    answer["result"] = Unstorable(answer.pop("unstorable"))
                data["answer"] = _ANSWERS[answer.pop("answer")](**answer)
        return cls(**data), frozenset(not_logged)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise Unreplayable(f"{record.kind} cannot be read back: {exc}") from None


def _resolved(record: ev.ObservationRecorded, decided: Sequence[ev.Event]) -> dict[str, Any]:
    """`record.data` with each reference replaced by what it points at."""
    data: Any = _copy(record.data)
    for path, (index, name) in sorted(record.refs.items()):
        if not (isinstance(index, int) and 0 <= index < len(decided)):
            raise Unreplayable(f"{record.kind}: {path} points past the decision's events")
        target = decided[index] if name is None else getattr(decided[index], name)
        *parents, last = path.split(".")
        holder = data
        for step in parents:
            holder = holder[int(step)] if isinstance(holder, list) else holder[step]
        if isinstance(holder, list):
            holder[int(last)] = target
        else:
            holder[last] = target
    return data


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _stand_in(size: int | None) -> dict[str, Any]:
    """Arguments the log does not keep, as ones decide refuses alike: of the same size, or
    not JSON at all (None)."""
    if size is None:
        return {"_": float("nan")}
    return {"_": "x" * max(size - len('{"_":""}'), 0)}
