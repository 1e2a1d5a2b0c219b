"""The fleet's `stats` output."""

from __future__ import annotations


from pydantic import Field
from .base import Out


class Percentiles(Out):
    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


class HourCount(Out):
    hour: str
    calls: int


class Takeovers(Out):
    crash: int
    planned: int


class Anomalies(Out):
    total: int
    by_kind: dict[str, int]


class Stats(Out):
    """`session-store stats --json`, GET /api/stats: calls that started in [since, until)."""
    since: str
    until: str
    calls: int
    calls_per_hour: list[HourCount]
    takeovers: Takeovers
    anomalies: Anomalies
    in_doubt_calls: list[str] = Field(description="calls with a tool call whose outcome was "
                                                  "in doubt after a crash (resolved as "
                                                  "unknown, run again, or by its outcome "
                                                  "check)")
    tool_wait_ms: Percentiles = Field(description="tool call requested -> first started")
    result_send_ms: Percentiles = Field(description="outcome -> first write of the result "
                                                    "that returned")
