"""The call list's outputs: `call-page` and the `CallSummary` of each call."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from .base import Out


class CallSummary(Out):
    """One call in a listing."""
    call: str
    status: Literal["open", "closed", "stale"] = Field(
        description="closed: a session.closed event exists; open: not closed, an event "
                    "within the last 2 hours; stale: not closed and silent for longer")
    start: str
    last_event: str
    duration_s: float
    silent_s: float | None = Field(description="seconds since the last event (calls not "
                                               "closed), else null")
    events: int
    epoch: int
    tool_calls: int
    deferred: int
    failures: int = Field(description="tool calls that failed")
    cancelled: int
    anomalies: int
    reconnects: int
    takeovers: int = Field(description="crashes + handovers")
    crashes: int = Field(description="takeovers after the old worker died mid-call")
    handovers: int = Field(description="takeovers after the old worker let the call go")
    finished_after_end: int = Field(0, description="tool outcomes logged after the call "
                                                   "ended (a tool still running at the hang-up)")
    in_doubt: int = Field(0, description="tool calls whose outcome is unknown: answered "
                                         "'outcome unknown', or unfinished when the call ended")


class CallPage(Out):
    """`session-store calls --json`, GET /api/calls."""
    calls: list[CallSummary]
    next_after: str | None = Field(description="pass as --after / ?after= for the next "
                                               "page; null on the last page")
