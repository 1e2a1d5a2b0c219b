"""One call's state at a point (`state`) and its events as exported (`export-line`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from .base import Out


class ExportLine(Out):
    """One line of `session-store export` and `tail --json` (JSON Lines), GET
    /export/CALL. `data` is the stored payload (redacted as asked); `hash` the stored chain
    hash; `redacted` the JSON paths masked."""
    export_schema: Literal[2]
    call: str
    version: int
    position: int
    type: str
    schema_version: int
    recorded_at: str
    recorded_at_us: int
    data: dict[str, Any]
    hash: str
    redacted: list[str]


class StateSend(Out):
    generation: Any
    via: Any
    version: int
    confirmed: bool


class StateToolCall(Out):
    tool_call_id: str
    name: Any
    status: str
    attempt: Any
    args: Any
    generation: Any
    requested_version: int
    result: Any
    error: Any
    outcome_unknown: bool
    checked: str | None = Field(None, description="what the tool's outcome check answered "
                                                  "(done, not_done, cannot_tell) after a crash "
                                                  "left the call in doubt; null if not asked")
    finished_after_end: bool = Field(False, description="its outcome was logged after the "
                                                        "call ended")
    reused_from: Any
    cancel_reason: Any
    reissue_of: Any
    superseded_by: Any
    in_current_session: bool = Field(description="a send whose write returned is in the "
                                                 "current session's lineage (by the log)")
    times_in_current_session: int
    sends: list[StateSend]


class StateHandle(Out):
    handle: Any
    generation: Any
    version: int
    issued_at: str | None
    last_consumed_client_message_index: Any


class StateGeneration(Out):
    generation: int
    version: int
    handle: Any
    parent: int | None
    parent_cutoff: int | None


class Turn(Out):
    role: str
    text: Any = Field(description="the words, or for role 'tool' the tool call id")


class State(Out):
    """`session-store state CALL [--at V] --json`, GET /api/state/CALL?at=V: the
    projection after version `version`, and the event at that version."""
    call: str
    version: int
    event: ExportLine | None
    opened: bool
    closed: bool
    model: Any
    worker: Any
    epoch: int
    takeovers: int
    generation: int
    connected: bool
    bot_speaking: bool
    reconnect_pending: Any
    reconnect_keys: list[Any]
    go_away_deadline: str | None
    newest_handle: Any
    reconnects: int
    anomalies: int
    last_event_at: str | None
    deferred: list[str]
    running: list[str]
    in_doubt: list[str] = Field(description="tool calls started and not finished by an earlier "
                                            "worker, or by any worker once the call ended")
    finished_after_end: list[str] = Field(default_factory=list, description="tool calls whose "
                                          "outcome was logged after the call ended")
    to_send: list[str] = Field(description="tool calls with an outcome no send in the "
                                           "current session's lineage holds")
    unanswered: list[str] = Field(description="tool calls not settled (neither sent to the "
                                              "current session nor cancelled)")
    settings: dict[str, Any]
    tool_calls_total: int
    tool_calls: list[StateToolCall]
    handles: list[StateHandle]
    generations: list[StateGeneration]
    conversation_total: int
    conversation: list[Turn]
