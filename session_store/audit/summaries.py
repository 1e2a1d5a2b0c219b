"""Call summaries for listings: one row per call from a few SQL aggregates (pure part).

A call's status: `closed` (a session.closed event exists), `open` (not closed, an event within
the last `STALE_AFTER_US`), `stale` (not closed and silent for longer: the worker probably
died and nobody took the call over). Counts come from event types: tool calls requested,
deferred, failed, cancelled; anomalies; reconnects (connections after the first); takeovers
(session.worker_attached: a new worker), split into crashes (the old worker died mid-call)
and hand-overs (it let the call go: timeline.PLANNED_REASONS, timeline.LETTING_GO).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from .fmt import EPOCH, iso

STALE_AFTER_US = 2 * 3600 * 1_000_000  # a resumption handle's lifetime: after it, nothing resumes
STATUSES = ("open", "closed", "stale")

#: Event types counted per call, and the counter each one feeds.
COUNTED_TYPES: dict[str, str] = {
    "tool.call_requested": "tool_calls",
    "tool.call_deferred": "deferred",
    "tool.call_failed": "failures",
    "tool.call_cancelled": "cancelled",
    "anomaly.recorded": "anomalies",
    "connection.connected": "connects",
    "session.worker_attached": "takeovers",
    "session.closed": "closes",
}


@dataclass
class CallSummary:
    call_id: str
    events: int
    epoch: int
    started_at_us: int
    last_event_at_us: int
    closed: bool
    status: str
    tool_calls: int = 0
    deferred: int = 0
    failures: int = 0
    cancelled: int = 0
    anomalies: int = 0
    reconnects: int = 0
    takeovers: int = 0
    handovers: int = 0  # takeovers after the old worker let the call go
    finished_after_end: int = 0  # tool outcomes logged after the call ended (tool_ends)
    in_doubt: int = 0  # tool calls whose outcome is unknown (tool_ends)
    now_us: int | None = None  # when the summary was made (for `silent_s`)

    @property
    def crashes(self) -> int:
        return self.takeovers - self.handovers

    @property
    def silent_s(self) -> float | None:
        """Seconds since the last event, for a call not closed."""
        if self.closed or self.now_us is None:
            return None
        return round(max(self.now_us - self.last_event_at_us, 0) / 1e6, 3)

    @property
    def duration_s(self) -> float:
        return round((self.last_event_at_us - self.started_at_us) / 1e6, 3)

    def to_json(self) -> dict[str, Any]:
        from .models import CallSummary as Model, dump

        return dump(Model, {
            "call": self.call_id, "status": self.status, "start": iso(self.started_at_us),
            "last_event": iso(self.last_event_at_us), "duration_s": self.duration_s,
            "silent_s": self.silent_s, "events": self.events, "epoch": self.epoch,
            "tool_calls": self.tool_calls, "deferred": self.deferred,
            "failures": self.failures, "cancelled": self.cancelled,
            "anomalies": self.anomalies, "reconnects": self.reconnects,
            "takeovers": self.takeovers, "crashes": self.crashes,
            "handovers": self.handovers, "finished_after_end": self.finished_after_end,
            "in_doubt": self.in_doubt})


def status_of(closed: bool, last_event_at_us: int, now_us: int,
              stale_after_us: int = STALE_AFTER_US) -> str:
    if closed:
        return "closed"
    return "stale" if last_event_at_us < now_us - stale_after_us else "open"


#: The events `tool_ends` reads (with their versions and call ids).
TOOL_END_TYPES = ("session.closed", "tool.call_started", "tool.call_completed",
                  "tool.call_failed", "tool.call_cancelled")


def tool_ends(rows: list[tuple[int, str, dict]]) -> tuple[int, int]:
    """(outcomes logged after the call ended, tool calls in doubt) from a call's
    (version, type, payload) rows of TOOL_END_TYPES. In doubt: answered "outcome unknown",
    or started and never finished in a call that ended (nobody is left to run it)."""
    closed_at = min((v for v, t, _d in rows if t == "session.closed"), default=None)
    started: set = set()
    finished: set = set()
    after = doubt = 0
    for version, etype, data in sorted(rows, key=lambda r: r[0]):
        call_id = data.get("call_id")
        if etype == "tool.call_started":
            started.add(call_id)
        elif etype != "session.closed":
            finished.add(call_id)
            after += closed_at is not None and version > closed_at and etype != "tool.call_cancelled"
            doubt += etype == "tool.call_failed" and data.get("outcome_unknown") is True
    if closed_at is not None:
        doubt += len(started - finished)
    return after, doubt


def summarise(head: tuple, counts: dict[str, int], now_us: int,
              stale_after_us: int = STALE_AFTER_US, handovers: int = 0,
              ends: tuple[int, int] = (0, 0)) -> CallSummary:
    """One summary from a stream head (id, version, epoch, created, updated), type counts,
    how many of its takeovers were planned hand-overs and its `tool_ends`."""
    call_id, version, epoch, created, updated = head
    closed = counts.get("session.closed", 0) > 0
    c = {COUNTED_TYPES[t]: n for t, n in counts.items() if t in COUNTED_TYPES}
    return CallSummary(
        call_id, version, epoch, created, updated, closed,
        status_of(closed, updated, now_us, stale_after_us),
        tool_calls=c.get("tool_calls", 0), deferred=c.get("deferred", 0),
        failures=c.get("failures", 0), cancelled=c.get("cancelled", 0),
        anomalies=c.get("anomalies", 0), reconnects=max(c.get("connects", 0) - 1, 0),
        takeovers=c.get("takeovers", 0), handovers=handovers, now_us=now_us,
        finished_after_end=ends[0], in_doubt=ends[1])


#: Orders of a listing: name -> (what it sorts by, descending?).
SORTS = {"newest": ("start", True), "oldest": ("start", False),
         "longest": ("duration", True), "shortest": ("duration", False),
         "most-events": ("events", True), "recent-activity": ("last_event", True)}


@dataclass(frozen=True)
class CallFilter:
    """Which calls a listing shows, in which order (`sort`, see SORTS), `limit` per page,
    after call `after`."""
    since_us: int | None = None  # started at or after
    until_us: int | None = None  # started before
    status: str | None = None
    search: str | None = None  # substring of the call id
    after: str | None = None  # the last call id of the previous page
    limit: int = 50
    text: str | None = None  # in a transcript, a tool's arguments or result (any case)
    tool: str | None = None  # asked for this tool
    failed: bool = False  # a tool call failed
    takeover: bool = False  # taken over by another worker
    anomaly: bool = False  # an anomaly was recorded
    min_duration_s: float | None = None
    max_duration_s: float | None = None
    sort: str = "newest"

    def __post_init__(self):
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; use one of {', '.join(STATUSES)}")
        if not 1 <= self.limit <= 10_000:
            raise ValueError("limit must be between 1 and 10000")
        if self.sort not in SORTS:
            raise ValueError(f"unknown sort {self.sort!r}; use one of {', '.join(SORTS)}")
        for name in ("min_duration_s", "max_duration_s"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and value < 10**9):
                raise ValueError(f"{name.replace('_s', '')} must be a number of seconds >= 0")

    def counted(self) -> "CallFilter":
        """The same calls, not paged (what a total counts)."""
        import dataclasses

        return dataclasses.replace(self, after=None)


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h)?$")


def parse_duration(text: str | None) -> float | None:
    """`90`, `90s`, `1.5m`, `2h`, `500ms`: seconds."""
    if text is None or str(text).strip() == "":
        return None
    m = _DURATION.match(str(text).strip())
    if not m:
        raise ValueError(f"not a duration: {text!r} (use 90s, 1.5m, 2h or 500ms)")
    scale = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[m.group(2)]
    return float(m.group(1)) * scale


def parse_time(text: str | None, now: datetime | None = None) -> int | None:
    """ISO 8601 (naive = UTC), or a relative age such as `90m`, `2h`, `7d`: microseconds."""
    if text is None or text == "":
        return None
    text = text.strip()
    m = _RELATIVE.match(text)
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
        now = now or datetime.now(timezone.utc)
        try:
            since = now - timedelta(**{unit: float(m.group(1))})
        except OverflowError:  # an age before year 1 (or past a timedelta): no such time
            raise ValueError(f"not a time: {text!r} (an age too large for a date)") from None
        return (since - EPOCH) // timedelta(microseconds=1)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use ISO 8601 like 2026-01-31T14:00:00Z, "
                         "or an age like 2h)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - EPOCH) // timedelta(microseconds=1)


def like_pattern(search: str) -> str:
    """A LIKE pattern matching `search` literally anywhere (escape char: backslash)."""
    escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


_OFFSET = re.compile(r"^\+(\d+(?:\.\d+)?)\s*(ms|s|m|h)?$")


def parse_point(text: str) -> tuple[str, int]:
    """A point in a call: `20` (version 20), `+12.5s` / `+500ms` / `+2m` (that long after
    the call's first event) or an ISO 8601 time. ("version", v), ("offset", µs) or
    ("time", µs since the epoch)."""
    text = str(text).strip()
    if re.fullmatch(r"-?\d+", text):  # (a negative one is checked against the call's range)
        return "version", int(text)
    m = _OFFSET.match(text)
    if m:
        scale = {"ms": 1_000, "s": 1_000_000, None: 1_000_000, "m": 60_000_000,
                 "h": 3_600_000_000}[m.group(2)]
        return "offset", int(float(m.group(1)) * scale)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a point in a call: {text!r} (a version like 20, a time since "
                         "the call began like +12.5s, or an ISO 8601 time)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return "time", (dt - EPOCH) // timedelta(microseconds=1)
