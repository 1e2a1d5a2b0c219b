"""The `timeline` output (and `live-update`, which carries its entries), with the
builders that turn a `..timeline.Timeline` into it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from .base import Out, dump, iso_times
from .calls import CallSummary


class Entry(Out):
    version: int
    position: int
    at: str
    offset_ms: float = Field(description="since the call's first event")
    type: str
    lane: str
    level: Literal["info", "warn", "error"]
    summary: str
    tool_call_id: str | None
    flags: list[str] = Field(description="last_of_worker: the old worker's last event "
                                         "before a takeover; takeover_crash, "
                                         "takeover_planned: the takeover")
    data: dict[str, Any]


class Attempt(Out):
    attempt: Any
    version: int
    at: str | None
    epoch: Any
    idempotency_key: Any


class SendOut(Out):
    generation: Any
    via: Any
    version: int | None = Field(description="the write-ahead intent (tool.result_sending)")
    at: str | None
    confirmed: bool = Field(description="the socket write returned (tool.result_sent): "
                                        "sent, which alone does not show the model has it")
    confirmed_version: int | None
    confirmed_at: str | None


class ProgressOut(Out):
    part: Any
    result: Any
    scheduling: Any
    at: str | None
    sent_via: Any
    sent_generation: Any
    sent_at: str | None = Field(description="the first write of it that returned")


class Evidence(Out):
    version: int
    kind: str = Field(description="handle: a resumption handle issued on that session "
                                  "after the send; spoke, wrote, asked for a tool: the "
                                  "model's reaction there")


class ToolCall(Out):
    tool_call_id: str
    name: Any
    args: Any
    generation: Any
    requested_version: int | None
    requested_at: str | None
    deferred: bool
    attempts: list[Attempt]
    started_at: str | None
    wait_ms: float | None = Field(description="requested -> first started")
    finished_version: int | None
    finished_at: str | None
    run_ms: float | None = Field(description="last started -> outcome")
    outcome: Literal["completed", "failed", "cancelled"] | None
    result: Any
    error: Any
    outcome_unknown: bool
    reused_from: Any
    reissue_of: Any
    superseded_by: Any
    cancel_reason: Any
    sends: list[SendOut]
    sent_at: str | None = Field(description="the first write of the result that returned")
    sent_via: Any
    sent_generation: Any
    send_ms: float | None = Field(description="outcome -> first write that returned")
    in_model: bool | None = Field(description="true: a send the current model state holds "
                                              "(by the log) and later evidence shows it "
                                              "arrived; false: no send the current state "
                                              "holds; null: not shown either way")
    in_model_evidence: Evidence | None
    clipped: bool = Field(description="requested before the events listed")
    mode: str = Field(description="how the server runs it: blocking (the model waits for "
                                  "the answer) or non_blocking (it goes on talking)")
    scheduling: Any = Field(description="how a NON_BLOCKING call's outcome is taken: "
                                        "WHEN_IDLE, SILENT or INTERRUPT")
    progress: list[ProgressOut] = Field(description="intermediate results, in order")


class Speech(Out):
    generation: Any
    start: str | None
    end: str | None
    start_version: int | None
    end_version: int | None
    end_source: Any
    duration_ms: float | None


class ReconnectOut(Out):
    reason: Any
    keys: list[str]
    requested_version: int | None
    requested_at: str | None
    go_away_time_left_s: Any
    disconnected_version: int | None
    disconnected_at: str | None
    disconnect_reason: Any
    detail: Any
    from_generation: Any
    connected_version: int | None
    connected_at: str | None
    generation: Any
    resumed_handle: Any
    waited_ms: float | None
    downtime_ms: float | None


class TakeoverOut(Out):
    version: int
    at: str
    worker: Any
    epoch: Any
    reason: Any
    kind: Literal["crash", "planned"]
    previous_worker: Any
    last_event_version: int | None = Field(description="the old worker's last event")
    last_event_at: str | None
    last_event_type: str | None
    silent_ms: float | None = Field(description="from the old worker's last event to the "
                                                "takeover")


class SettingOut(Out):
    version: int
    at: str
    keys: Any
    values: Any
    needs_reconnect: Any


class HandleOut(Out):
    version: int
    at: str
    generation: Any
    handle: Any
    last_consumed_client_message_index: Any


class Problem(Out):
    version: int
    at: str | None
    kind: str
    detail: Any


class Timeline(Out):
    """`session-store timeline CALL --json`, GET /api/timeline/CALL. Facts (tool calls,
    takeovers, problems) are the whole call's; `entries` lists the window asked for."""
    call: str
    head: int = Field(description="the call's newest version (0: not read)")
    first_version: int
    last_version: int
    start: str | None
    end: str | None
    summary: CallSummary | None
    entries: list[Entry]
    tool_calls: list[ToolCall]
    speech: list[Speech]
    reconnects: list[ReconnectOut]
    takeovers: list[TakeoverOut]
    settings: list[SettingOut]
    handles: list[HandleOut]
    problems: list[Problem]


class LiveUpdate(Out):
    """One server-sent event of GET /api/live/CALL: what changed since the last one."""
    call: str
    head: int
    status: Literal["open", "closed", "stale"]
    last_event_at: str | None
    entries: list[Entry]


def entry_json(e) -> dict[str, Any]:
    """A timeline entry (`timeline.Entry`) as `Entry` (not yet checked: see `dump`)."""
    import dataclasses

    return iso_times(dataclasses.asdict(e))


def timeline_json(tl, summary=None) -> dict[str, Any]:
    import dataclasses

    def tc(c) -> dict[str, Any]:
        d = dataclasses.asdict(c)
        d["attempts"] = [iso_times(a) for a in d["attempts"]]
        d["sends"] = [iso_times(s) for s in d["sends"]]
        d["progress"] = [iso_times(p) for p in d["progress"]]
        return iso_times(d)

    data = {
        "call": tl.call_id, "head": tl.head, "first_version": tl.first_version,
        "last_version": tl.last_version, "start": iso_times({"start_us": tl.start_us})["start"],
        "end": iso_times({"end_us": tl.end_us})["end"],
        "summary": summary.to_json() if summary is not None else None,
        "entries": [entry_json(e) for e in tl.entries],
        "tool_calls": [tc(c) for c in tl.tool_calls.values()],
        "speech": [{**iso_times(dataclasses.asdict(s)), "duration_ms": s.duration_ms}
                   for s in tl.speech],
        "reconnects": [iso_times(dataclasses.asdict(r)) for r in tl.reconnects],
        "takeovers": [iso_times(dataclasses.asdict(t)) for t in tl.takeovers],
        "settings": [iso_times(s) for s in tl.settings],
        "handles": [iso_times(h) for h in tl.handles],
        "problems": [iso_times(p) for p in tl.problems],
    }
    return dump(Timeline, data)
