"""What a timeline holds: its entries, tool calls, speech, reconnects and takeovers.

Plain records, filled by the builder (`builder.py`) as events go by; `Timeline.to_json`
is the published `timeline` output (`..models.timeline_json`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..fmt import ms


LANES = ("session", "speech", "tools", "connection", "settings", "conversation", "other",
         "errors")

#: Reasons a worker gives for attaching that mean a planned hand-over, not a crash.
PLANNED_REASONS = ("handover", "deploy", "drain", "planned")
#: How an old worker that lets a call go cleanly ends its live session.
LETTING_GO = ("shutdown", "handover")


@dataclass
class Entry:
    version: int
    position: int
    at_us: int
    offset_ms: float
    type: str
    lane: str
    level: str  # info | warn | error
    summary: str
    data: dict[str, Any]
    tool_call_id: str | None = None
    #: last_of_worker: the old worker's last event before a takeover;
    #: takeover_crash / takeover_planned: the takeover itself
    flags: list[str] = field(default_factory=list)


@dataclass
class Send:
    generation: int | None
    via: str | None
    version: int | None  # the write-ahead intent (tool.result_sending)
    at_us: int | None = None
    confirmed: bool = False  # the write returned (tool.result_sent)
    confirmed_version: int | None = None
    confirmed_at_us: int | None = None


@dataclass
class ToolCallView:
    tool_call_id: str
    name: str | None = None
    args: Any = None
    generation: int | None = None
    requested_version: int | None = None
    requested_at_us: int | None = None
    deferred: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    started_at_us: int | None = None
    wait_ms: float | None = None  # requested -> (first) started
    finished_version: int | None = None
    finished_at_us: int | None = None
    run_ms: float | None = None  # (last) started -> outcome
    outcome: str | None = None  # completed | failed | cancelled
    result: Any = None
    error: str | None = None
    outcome_unknown: bool = False
    reused_from: str | None = None
    reissue_of: str | None = None  # Gemini re-asked for that call: this id gets its outcome
    superseded_by: str | None = None
    cancel_reason: str | None = None
    sends: list[Send] = field(default_factory=list)
    sent_at_us: int | None = None  # the first write that returned
    sent_via: str | None = None
    sent_generation: int | None = None
    send_ms: float | None = None  # outcome -> first write that returned
    #: True: a send the current model state holds (by the log's rules) and later evidence
    #: shows it arrived; False: no send the current state holds; None: sent, no evidence yet
    #: (or no outcome yet, or the call's final state was not read).
    in_model: bool | None = None
    in_model_evidence: dict[str, Any] | None = None  # {"version", "kind"}
    clipped: bool = False  # requested before the events listed
    mode: str = "blocking"  # how the server runs it: blocking | non_blocking
    scheduling: str | None = None  # how a NON_BLOCKING call's outcome is taken
    # Intermediate results: {"part", "result", "scheduling", "at_us", "sent_via",
    # "sent_generation", "sent_at_us"} (the first write of each that returned).
    progress: list[dict[str, Any]] = field(default_factory=list)

    @property
    def end_us(self) -> int | None:
        """Where the call's bar ends: the send, else the outcome, else the last start."""
        return self.sent_at_us or self.finished_at_us or self.started_at_us

    @property
    def in_model_words(self) -> str:
        """The "in model" cell (CLI and viewer alike): yes only with evidence, NO when no
        send the current model state holds, "not shown" when sent without a sign since."""
        if self.in_model is True:
            sign = self.in_model_evidence or {}
            return f"yes ({sign.get('kind')} v{sign.get('version')})"
        if self.in_model is False:
            return "NO"
        return "not shown" if self.sent_at_us is not None else ""


@dataclass
class SpeechSegment:
    generation: int | None
    start_us: int | None  # None: began before the events listed
    end_us: int | None = None  # None: still speaking at the end of the events listed
    start_version: int | None = None
    end_version: int | None = None
    end_source: str | None = None

    @property
    def duration_ms(self) -> float | None:
        return ms(self.start_us, self.end_us)


@dataclass
class Reconnect:
    reason: str | None = None
    keys: list[str] = field(default_factory=list)
    requested_version: int | None = None
    requested_at_us: int | None = None
    go_away_time_left_s: float | None = None
    disconnected_version: int | None = None
    disconnected_at_us: int | None = None
    disconnect_reason: str | None = None
    detail: str = ""
    from_generation: int | None = None
    connected_version: int | None = None
    connected_at_us: int | None = None
    generation: int | None = None
    resumed_handle: str | None = None  # None: a fresh (seeded) session
    waited_ms: float | None = None  # requested -> disconnected (buffered until turn end)
    downtime_ms: float | None = None  # disconnected -> connected


@dataclass
class Takeover:
    version: int
    at_us: int
    worker: str | None
    epoch: int | None
    reason: str | None
    kind: str  # crash | planned
    previous_worker: str | None = None
    last_event_version: int | None = None  # the old worker's last event
    last_event_at_us: int | None = None
    last_event_type: str | None = None
    silent_ms: float | None = None  # from that event to the takeover


@dataclass
class Timeline:
    call_id: str
    t0_us: int
    first_version: int
    last_version: int
    start_us: int | None
    end_us: int | None
    head: int = 0  # the call's newest version (0: not known)
    entries: list[Entry] = field(default_factory=list)
    tool_calls: dict[str, ToolCallView] = field(default_factory=dict)
    speech: list[SpeechSegment] = field(default_factory=list)
    reconnects: list[Reconnect] = field(default_factory=list)
    takeovers: list[Takeover] = field(default_factory=list)
    settings: list[dict[str, Any]] = field(default_factory=list)
    handles: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)

    def only(self, lanes: Iterable[str] | None = None,
             types: Iterable[str] | None = None) -> "Timeline":
        """The same facts, listing only the entries of these lanes and types (a type ending
        in `.` or `*` is a prefix: `tool.`)."""
        keep = Timeline.keeps(lanes, types)
        return replace(self, entries=[e for e in self.entries if keep(e)])

    @staticmethod
    def keeps(lanes: Iterable[str] | None = None,
              types: Iterable[str] | None = None) -> Callable[[Entry], bool]:
        """Whether `only(lanes, types)` lists an entry."""
        lanes = set(lanes or ())
        prefixes = tuple(t.rstrip("*") for t in types or ())

        def keep(e: Entry) -> bool:
            return ((not lanes or e.lane in lanes)
                    and (not prefixes or any(e.type == p or (p.endswith(".")
                                                              and e.type.startswith(p))
                                             for p in prefixes)))
        return keep

    def to_json(self, summary=None) -> dict[str, Any]:
        """models.Timeline; `summary`: the call's CallSummary, when known."""
        from ..models import timeline_json  # (the one definition of this output)

        return timeline_json(self, summary)
