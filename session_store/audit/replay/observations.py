"""Which logged events make one decision: the observation each group of them records.

`decide(state, observation)` writes its events in one append, so they share a timestamp; a
group starts at a decision's first event and runs while the events that decision writes
follow at the same time (the table in replayer.py's docstring).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from ... import events as ev
from ...decide import (RESYNC_KINDS, CancellationArrived, FunctionCall, GoAway,
                       InteractionStatusObserved, InterruptionObserved, Observation,
                       ServerMessageRejected, SettingsUpdate, SpeechStarted, SpeechStopped,
                       ToolCallsArrived)
from ...records import RecordedEvent

TOOL_CALL_ANOMALIES = ("tool_call_without_name", "tool_call_without_id", "duplicate_tool_call_id")
#: Anomalies that qualify a call requested in the same group (decide refused to run it).
CALL_REFUSALS = ("tool_call_without_name", "unknown_tool", "tool_args_too_large",
                 "invalid_tool_args")
#: Anomalies decided on a ServerMessageRejected observation.
MESSAGE_ANOMALIES = tuple(RESYNC_KINDS) + ("unknown_message", "message_too_big")



class Group(NamedTuple):
    observation: Observation
    length: int  # records in the group
    # Calls whose arguments the log does not keep: replay gave them ones that lead to the
    # same refusal, and they compare as absent.
    args_not_logged: frozenset[str] = frozenset()


def group_at(recs: list[RecordedEvent], i: int, generation: int) -> Group | None:
    """The decision group starting at record i, if one does: the observation it records.
    `generation`: the state's, before the group."""
    rec = recs[i]
    e = rec.event

    def same_time(j: int) -> bool:
        return j < len(recs) and recs[j].recorded_at_us == rec.recorded_at_us

    match e:
        case ev.ToolCallRequested() | ev.AnomalyRecorded() if (
                not isinstance(e, ev.AnomalyRecorded) or e.kind in TOOL_CALL_ANOMALIES):
            return _tool_calls_group(recs, i)
        case ev.AnomalyRecorded() if e.kind in MESSAGE_ANOMALIES:
            n = 1
            if same_time(i + 1):
                nxt = recs[i + 1].event
                if isinstance(nxt, ev.ReconnectRequested) and nxt.reason == e.kind:
                    n = 2
            detail = e.detail if isinstance(e.detail, dict) else {}
            return Group(ServerMessageRejected(e.kind, detail, e.generation), n)
        case ev.BotStartedSpeaking():
            return Group(SpeechStarted(e.generation, e.source), 1)
        case ev.BotStoppedSpeaking():
            return Group(SpeechStopped(e.generation, e.source), 1)
        case ev.Interrupted():
            return Group(InterruptionObserved(e.generation), 1)
        case ev.SettingsChanged():
            n = 1
            if same_time(i + 1):
                nxt = recs[i + 1].event
                if isinstance(nxt, ev.ReconnectRequested) and nxt.reason == "settings":
                    n = 2
            return Group(SettingsUpdate(tuple(e.keys), dict(e.values)), n)
        case ev.InteractionStatus():
            return Group(InteractionStatusObserved(e.generation, e.status, e.source), 1)
        case ev.GoAwayReceived():
            return Group(GoAway(e.generation, e.time_left_s), 1)
        case ev.ToolCallCancelled(reason="server") | ev.AnomalyRecorded(
                kind="cancellation_for_unknown_call"):
            ids_: list[Any] = []  # (an id the anomaly lacks is replayed as None, as it was seen)
            j, gen = i, None
            while same_time(j):
                x = recs[j].event
                if isinstance(x, ev.ToolCallCancelled) and x.reason == "server":
                    ids_.append(x.call_id)
                elif (isinstance(x, ev.ToolCallCancelled)
                      and x.reason == "reissue_cancelled"):
                    pass  # decided with the cancellation of the id that re-asked for it
                elif (isinstance(x, ev.AnomalyRecorded)
                      and x.kind == "cancellation_for_unknown_call"):
                    ids_.append((x.detail or {}).get("call_id"))
                    gen = x.generation
                else:
                    break
                j += 1
            return Group(CancellationArrived(tuple(ids_), gen or generation), j - i)
    return None

def _tool_calls_group(recs: list[RecordedEvent], i: int) -> Group:
    """Rebuild the ToolCallsArrived a group of call events was decided on."""
    at = recs[i].recorded_at_us
    args_not_logged: set[str] = set()
    calls: list[FunctionCall] = []
    index: dict[str, int] = {}  # call id -> its FunctionCall in `calls`
    made_up: set[str] = set()  # ids the shell made (logged just before their request)
    j, gen = i, None
    while j < len(recs) and recs[j].recorded_at_us == at:
        x = recs[j].event
        d = x.detail if isinstance(x, ev.AnomalyRecorded) and isinstance(x.detail, dict) \
            else {}
        if isinstance(x, ev.ToolCallRequested):
            index[x.call_id] = len(calls)
            calls.append(FunctionCall(x.call_id, x.name, x.args,
                                      id_generated=x.call_id in made_up,
                                      declared=x.declared))
        elif isinstance(x, ev.AnomalyRecorded) and x.kind == "tool_call_without_id" \
                and d.get("call_id"):
            made_up.add(d["call_id"])
        elif isinstance(x, ev.AnomalyRecorded) and x.kind in CALL_REFUSALS \
                and d.get("call_id") in index:
            at_ = index[d["call_id"]]
            call = calls[at_]
            if x.kind == "unknown_tool":
                call = dataclasses.replace(call, has_handler=False)
            elif x.kind == "tool_args_too_large" and isinstance(d.get("bytes"), int):
                pad = max(d["bytes"] - len('{"_":""}'), 0)  # same size, same refusal
                call = dataclasses.replace(call, args={"_": "x" * pad})
                args_not_logged.add(d["call_id"])
            elif x.kind == "invalid_tool_args":
                call = dataclasses.replace(call, args={"_": float("nan")})
                args_not_logged.add(d["call_id"])
            calls[at_] = call
        elif isinstance(x, ev.AnomalyRecorded) and x.kind in TOOL_CALL_ANOMALIES:
            calls.append(FunctionCall(
                d.get("call_id") if x.kind != "tool_call_without_id" else None,
                d.get("name") if x.kind != "tool_call_without_name" else None,
                d.get("args", {})))
        elif not (isinstance(x, (ev.ToolCallDeferred, ev.ToolCallCompleted,
                                 ev.ToolCallReissued, ev.ToolCallFailed))
                  and x.call_id in index
                  and (not isinstance(x, ev.ToolCallCompleted) or x.reused_from)
                  and (not isinstance(x, ev.ToolCallFailed) or not x.outcome_unknown)):
            break
        if isinstance(x, (ev.ToolCallRequested, ev.AnomalyRecorded)):
            gen = x.generation if gen is None else gen
        j += 1
    return Group(ToolCallsArrived(tuple(calls), gen or 0), j - i, frozenset(args_not_logged))
