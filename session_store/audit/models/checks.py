"""The checks' outputs: `verify` (hash chains) and `replay` (divergences)."""

from __future__ import annotations

from typing import Any
from .base import Out



class VerifiedCall(Out):
    call: str
    ok: bool
    events_checked: int
    first_bad_version: int | None
    first_bad_position: int | None
    reason: str


class Verify(Out):
    """`session-store verify [CALL] --json`."""
    ok: bool
    calls: list[VerifiedCall]


class Divergence(Out):
    version: int
    to_version: int
    kind: str
    message: str
    observation: dict[str, Any] | None
    logged: list[dict[str, Any]]
    decided: list[dict[str, Any]]


class ReplayCoverage(Out):
    """Which of the log's decisions a replay decided again (ReplayReport.coverage)."""
    decisions_logged: int
    not_replayed: dict[str, int]
    reconstructed: int
    text: str


class Replay(Out):
    """`session-store replay CALL --json`, GET /api/replay/CALL."""
    call: str
    ok: bool
    events: int
    decisions_checked: int
    effects_checked: int
    error: str | None
    coverage: ReplayCoverage
    divergences: list[Divergence]
