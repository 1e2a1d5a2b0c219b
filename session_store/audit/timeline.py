"""A call's timeline: one ordered view of what happened, built from its events (pure).

`build_timeline(records)` turns recorded events (already redacted by the caller) into:
entries (one per event: lane, level, a one-line summary), tool calls (request → start → outcome
→ sends, with wait and run times and how/when the result reached the model), bot speech
segments, reconnect episodes (why, how long, resumed or fresh), takeovers, settings changes,
handles and problems. It also works on a window of a long call: whatever began before the
window is shown as starting at the window's left edge (`clipped`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CorruptEvent, SchemaVersionTooNew, UnknownEventType
from ..projection import SessionState, times_held
from ..records import RecordedEvent
from .delivery import effective_sends
from .fmt import EPOCH, iso, ms, short

__all__ = ["LANES", "lane_of", "build_timeline", "Timeline", "Entry", "ToolCallView",
           "SpeechSegment", "Reconnect", "effective_sends", "EPOCH", "iso", "ms", "short"]

LANES = ("session", "speech", "tools", "connection", "settings", "conversation", "errors")

_LANE_BY_PREFIX = {"session": "session", "connection": "connection", "speech": "speech",
                   "settings": "settings", "tool": "tools", "conversation": "conversation",
                   "anomaly": "errors"}


def lane_of(event_type: str) -> str:
    return _LANE_BY_PREFIX.get(event_type.split(".", 1)[0], "errors")


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
    call_id: str | None = None


@dataclass
class Send:
    generation: int
    via: str
    version: int
    at_us: int
    confirmed: bool = False
    confirmed_version: int | None = None
    confirmed_at_us: int | None = None


@dataclass
class ToolCallView:
    call_id: str
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
    delivered_at_us: int | None = None  # first confirmed send
    delivered_via: str | None = None
    delivered_generation: int | None = None
    delivery_ms: float | None = None  # outcome -> first confirmed send
    in_model: bool | None = None  # from the final state, when the whole call was read
    clipped: bool = False  # requested before this window

    @property
    def end_us(self) -> int | None:
        """Where the call's bar ends: delivery, else outcome, else the last start."""
        return self.delivered_at_us or self.finished_at_us or self.started_at_us


@dataclass
class SpeechSegment:
    generation: int | None
    start_us: int | None  # None: began before the window
    end_us: int | None = None  # None: still speaking at the window's end
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
class Timeline:
    call_id: str
    t0_us: int
    first_version: int
    last_version: int
    start_us: int | None
    end_us: int | None
    entries: list[Entry] = field(default_factory=list)
    tool_calls: dict[str, ToolCallView] = field(default_factory=dict)
    speech: list[SpeechSegment] = field(default_factory=list)
    reconnects: list[Reconnect] = field(default_factory=list)
    takeovers: list[dict[str, Any]] = field(default_factory=list)
    settings: list[dict[str, Any]] = field(default_factory=list)
    handles: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def tc(c: ToolCallView) -> dict[str, Any]:
            d = asdict(c)
            for k in ("requested_at_us", "started_at_us", "finished_at_us", "delivered_at_us"):
                d[k.replace("_us", "")] = iso(d.pop(k))
            d["sends"] = [{**{k: v for k, v in s.items() if not k.endswith("_us")},
                           "at": iso(s["at_us"]), "confirmed_at": iso(s["confirmed_at_us"])}
                          for s in d["sends"]]
            return d

        return {
            "call": self.call_id, "first_version": self.first_version,
            "last_version": self.last_version, "start": iso(self.start_us),
            "end": iso(self.end_us),
            "entries": [{**{k: v for k, v in asdict(e).items() if k != "at_us"},
                         "at": iso(e.at_us)} for e in self.entries],
            "tool_calls": [tc(c) for c in self.tool_calls.values()],
            "speech": [_times(asdict(s), duration_ms=s.duration_ms) for s in self.speech],
            "reconnects": [_times(asdict(r)) for r in self.reconnects],
            "takeovers": [_times(t) for t in self.takeovers],
            "settings": [_times(s) for s in self.settings],
            "handles": [_times(h) for h in self.handles],
            "problems": [_times(p) for p in self.problems],
        }


def _times(d: dict[str, Any], **extra) -> dict[str, Any]:
    """Replace every `*_at_us` / `*_us` time with its ISO form under the name without `_us`."""
    out = {}
    for k, v in d.items():
        if k.endswith("_us") and (k.endswith("at_us") or k in ("start_us", "end_us")):
            out[k[:-3]] = iso(v)
        else:
            out[k] = v
    out.update(extra)
    return out


class _Builder:
    def __init__(self, call_id: str, t0_us: int | None):
        self.tl: Timeline | None = None
        self.call_id, self.t0_us = call_id, t0_us
        self.open_speech: SpeechSegment | None = None
        self.episode: Reconnect | None = None
        self.generation: int | None = None
        self.seen_connect = False
        self.takeover_pending = False
        self.closed_version: int | None = None

    # --------------------------------------------------------------- helpers
    def call(self, call_id: str) -> ToolCallView:
        c = self.tl.tool_calls.get(call_id)
        if c is None:
            c = self.tl.tool_calls[call_id] = ToolCallView(call_id, clipped=True)
        return c

    def inherit(self, original: ToolCallView) -> None:
        """A re-issued id takes its original's outcome as soon as there is one."""
        seen = set()
        while original.superseded_by and original.outcome in ("completed", "failed") \
                and original.call_id not in seen:
            seen.add(original.call_id)
            new = self.call(original.superseded_by)
            if new.outcome is None:
                new.outcome, new.result, new.error = original.outcome, original.result, original.error
                new.outcome_unknown, new.reused_from = original.outcome_unknown, original.call_id
                new.finished_version, new.finished_at_us = (original.finished_version,
                                                            original.finished_at_us)
            original = new

    def end_speech(self, rec: RecordedEvent, source: str) -> None:
        if self.open_speech is not None:
            self.open_speech.end_us, self.open_speech.end_version = rec.recorded_at_us, rec.version
            self.open_speech.end_source = source
            self.open_speech = None

    def ep(self) -> Reconnect:
        if self.episode is None:
            self.episode = Reconnect(from_generation=self.generation)
        return self.episode

    def problem(self, rec: RecordedEvent, kind: str, detail: Any) -> None:
        self.tl.problems.append({"version": rec.version, "at_us": rec.recorded_at_us,
                                 "kind": kind, "detail": detail})

    # --------------------------------------------------------------- one event
    def add(self, rec: RecordedEvent) -> None:
        if self.tl is None:
            t0 = self.t0_us if self.t0_us is not None else rec.recorded_at_us
            self.tl = Timeline(self.call_id or rec.stream_id, t0, rec.version, rec.version,
                               rec.recorded_at_us, rec.recorded_at_us)
        tl, t, v = self.tl, rec.recorded_at_us, rec.version
        tl.last_version, tl.end_us = v, t
        unreadable = None
        try:
            d = rec.data
        except Exception as exc:  # noqa: BLE001 - shown as a problem, never hidden
            d, unreadable = {}, str(exc)
            self.problem(rec, "unreadable_event", unreadable)
        else:
            try:
                rec.event  # noqa: B018 - a newer schema or a payload of the wrong shape
            except (SchemaVersionTooNew, CorruptEvent) as exc:
                # Described from its raw data below, but flagged: this code cannot vouch
                # for what it means (unknown types are flagged by `describe`).
                unreadable = str(exc)
                self.problem(rec, "unreadable_event", unreadable)
            except UnknownEventType:
                pass
        if not isinstance(d, dict):
            d = {}
        level, call_id = "info", d.get("call_id") if isinstance(d.get("call_id"), str) else None
        if self.closed_version is not None:
            self.problem(rec, "event_after_close", {"type": rec.type,
                                                    "closed_at_version": self.closed_version})
        summary = self.describe(rec, d)
        if isinstance(summary, tuple):
            summary, level = summary
        if unreadable is not None:
            summary, level = f"UNREADABLE by this code: {summary}", "error"
        tl.entries.append(Entry(v, rec.position, t, ms(tl.t0_us, t) or 0.0, rec.type,
                                lane_of(rec.type), level, summary, d, call_id))

    def describe(self, rec: RecordedEvent, d: dict[str, Any]):  # noqa: C901 - one case per type
        t, v, tl = rec.recorded_at_us, rec.version, self.tl
        match rec.type:
            case "session.opened":
                return (f"session opened: model {d.get('model')}, tools {d.get('tools')}, "
                        f"worker {d.get('worker')}, epoch {d.get('epoch')}")
            case "session.worker_attached":
                self.end_speech(rec, "takeover")
                tl.takeovers.append({"version": v, "at_us": t, "worker": d.get("worker"),
                                     "epoch": d.get("epoch"), "reason": d.get("reason")})
                self.takeover_pending = True
                return (f"worker {d.get('worker')} took the call over (epoch {d.get('epoch')}, "
                        f"{d.get('reason')})", "warn")
            case "session.closed":
                self.end_speech(rec, "closed")
                self.closed_version = v
                return f"session closed: {d.get('reason')}"
            case "connection.connected":
                return self._connected(rec, d)
            case "connection.disconnected":
                if d.get("generation") == self.generation:
                    self.end_speech(rec, "disconnected")
                e = self.ep()
                e.disconnected_version, e.disconnected_at_us = v, t
                e.disconnect_reason, e.detail = d.get("reason"), d.get("detail", "")
                e.from_generation = d.get("generation")
                e.reason = e.reason or d.get("reason")
                e.waited_ms = ms(e.requested_at_us, t)
                bad = d.get("reason") in ("error", "handshake_failed")
                if bad:
                    self.problem(rec, f"disconnected:{d.get('reason')}", d.get("detail", ""))
                detail = f" ({short(d.get('detail'), 80)})" if d.get("detail") else ""
                return (f"disconnected generation {d.get('generation')}: {d.get('reason')}"
                        f"{detail}", "error" if bad else "warn")
            case "connection.handle_issued":
                tl.handles.append({"version": v, "at_us": t, "generation": d.get("generation"),
                                   "handle": d.get("handle"), "last_consumed_client_message_index":
                                   d.get("last_consumed_client_message_index")})
                idx = d.get("last_consumed_client_message_index")
                return (f"resumption handle {short(d.get('handle'), 40)} issued on generation "
                        f"{d.get('generation')}" + (f" (last consumed message {idx})"
                                                    if idx is not None else ""))
            case "connection.handle_withheld":
                return (f"resumption handle {short(d.get('handle'), 40)} withheld on generation "
                        f"{d.get('generation')} (it may predate content just sent)", "warn")
            case "connection.go_away":
                e = self.ep()
                e.reason = e.reason or "go_away"
                e.go_away_time_left_s = d.get("time_left_s")
                e.requested_version = e.requested_version or v
                e.requested_at_us = e.requested_at_us or t
                return (f"goAway on generation {d.get('generation')}: "
                        f"{d.get('time_left_s')} s left", "warn")
            case "connection.reconnect_requested":
                e = self.ep()
                e.reason, e.keys = d.get("reason"), list(d.get("keys") or [])
                e.requested_version, e.requested_at_us = v, t
                keys = f" ({', '.join(map(str, e.keys))})" if e.keys else ""
                return f"reconnect requested: {d.get('reason')}{keys}; buffered until turn end"
            case "speech.bot_started":
                if self.open_speech is not None:  # a second start: close the first
                    self.end_speech(rec, "restarted")
                self.open_speech = SpeechSegment(d.get("generation"), t, start_version=v)
                tl.speech.append(self.open_speech)
                return f"bot started speaking (generation {d.get('generation')})"
            case "speech.bot_stopped" | "speech.interrupted":
                src = d.get("source", "interruption") if rec.type == "speech.bot_stopped" \
                    else "interruption"
                if self.open_speech is None:
                    seg = SpeechSegment(d.get("generation"), None)
                    tl.speech.append(seg)
                    self.open_speech = seg
                seg = self.open_speech
                self.end_speech(rec, src)
                took = f" after {seg.duration_ms / 1000:.1f} s" if seg.duration_ms is not None else ""
                if rec.type == "speech.interrupted":
                    return f"bot interrupted{took}", "warn"
                return f"bot stopped speaking ({src}){took}"
            case "settings.changed":
                tl.settings.append({"version": v, "at_us": t, "keys": d.get("keys"),
                                    "values": d.get("values"),
                                    "needs_reconnect": d.get("needs_reconnect")})
                vals = f" = {short(d.get('values'), 80)}" if d.get("values") else ""
                return (f"settings changed: {', '.join(map(str, d.get('keys') or []))}{vals}"
                        + ("; needs a reconnect" if d.get("needs_reconnect") else ""))
            case "conversation.message":
                return f"{d.get('role')}: {short(d.get('text'), 120)}"
            case "anomaly.recorded":
                self.problem(rec, f"anomaly:{d.get('kind')}", d.get("detail"))
                return f"anomaly {d.get('kind')}: {short(d.get('detail'), 100)}", "error"
        if rec.type.startswith("tool."):
            return self._tool(rec, d)
        self.problem(rec, "unknown_event_type", rec.type)
        return f"{rec.type} (unknown to this code): {short(d, 100)}", "error"

    def _connected(self, rec: RecordedEvent, d: dict[str, Any]):
        t, v = rec.recorded_at_us, rec.version
        gen, handle = d.get("generation"), d.get("handle")
        how = f"resumed from handle {short(handle, 40)}" if handle else "fresh (seeded history)"
        self.end_speech(rec, "reconnected")
        if self.seen_connect or self.episode is not None or self.takeover_pending:
            e = self.ep()
            if e.reason is None:
                e.reason = "takeover" if self.takeover_pending else "connection_lost"
            e.connected_version, e.connected_at_us, e.generation = v, t, gen
            e.resumed_handle = handle
            e.downtime_ms = ms(e.disconnected_at_us, t)
            self.tl.reconnects.append(e)
            summary = f"reconnected: generation {gen}, {how} (reason: {e.reason})"
        else:
            summary = f"connected: generation {gen}, {how}"
        self.episode, self.generation, self.seen_connect = None, gen, True
        self.takeover_pending = False
        return summary

    def _tool(self, rec: RecordedEvent, d: dict[str, Any]):
        t, v = rec.recorded_at_us, rec.version
        cid = d.get("call_id")
        if not isinstance(cid, str):
            self.problem(rec, "tool_event_without_call_id", d)
            return f"{rec.type} without a call id", "error"
        c = self.call(cid)
        match rec.type:
            case "tool.call_requested":
                c.name, c.args, c.generation = d.get("name"), d.get("args"), d.get("generation")
                c.requested_version, c.requested_at_us, c.clipped = v, t, False
                return (f"{cid}: {c.name}({short(c.args, 80)}) requested on generation "
                        f"{c.generation}")
            case "tool.call_reissued":
                orig = self.call(d.get("original")) if isinstance(d.get("original"), str) else None
                c.reissue_of = d.get("original")
                if orig is not None:
                    orig.superseded_by = cid
                    self.inherit(orig)
                return (f"{cid}: Gemini asked again for {d.get('original')} (same tool and "
                        "arguments); it gets that call's outcome, the tool does not run twice")
            case "tool.call_deferred":
                c.deferred = True
                return f"{cid}: deferred until the bot stops speaking"
            case "tool.call_started":
                c.attempts.append({"attempt": d.get("attempt"), "version": v, "at_us": t,
                                   "epoch": d.get("epoch"),
                                   "idempotency_key": d.get("idempotency_key")})
                if c.started_at_us is None:
                    c.started_at_us, c.wait_ms = t, ms(c.requested_at_us, t)
                waited = f" after waiting {c.wait_ms:.0f} ms" if c.wait_ms is not None else ""
                again = f" (attempt {d.get('attempt')})" if d.get("attempt", 1) != 1 else ""
                return f"{cid}: {c.name or 'tool'} started{again}{waited}"
            case "tool.call_completed":
                c.outcome, c.result, c.reused_from = "completed", d.get("result"), d.get("reused_from")
                c.finished_version, c.finished_at_us = v, t
                orig = (self.tl.tool_calls.get(c.reused_from) if isinstance(c.reused_from, str)
                        else None)
                if orig is not None and not orig.superseded_by:  # as the projection links them
                    c.reissue_of, orig.superseded_by = c.reused_from, cid
                if c.reused_from:
                    return (f"{cid}: answered from the recorded result of {c.reused_from} "
                            f"(not run again): {short(c.result, 80)}")
                c.run_ms = ms(c.attempts[-1]["at_us"] if c.attempts else None, t)
                self.inherit(c)
                ran = f" in {c.run_ms:.0f} ms" if c.run_ms is not None else ""
                return f"{cid}: completed{ran}: {short(c.result, 80)}"
            case "tool.call_failed":
                c.outcome, c.error = "failed", d.get("error")
                c.outcome_unknown = bool(d.get("outcome_unknown"))
                c.finished_version, c.finished_at_us = v, t
                c.run_ms = ms(c.attempts[-1]["at_us"] if c.attempts else None, t)
                self.inherit(c)
                self.problem(rec, "tool_failed", {"call_id": cid, "error": c.error,
                                                  "outcome_unknown": c.outcome_unknown})
                unknown = " (outcome unknown: in doubt after a crash)" if c.outcome_unknown else ""
                return f"{cid}: failed{unknown}: {short(c.error, 80)}", "error"
            case "tool.call_cancelled":
                c.outcome, c.cancel_reason = "cancelled", d.get("reason")
                c.finished_version, c.finished_at_us = v, t
                return f"{cid}: cancelled ({d.get('reason')})", "warn"
            case "tool.result_sending":
                c.sends.append(Send(d.get("generation"), d.get("via"), v, t))
                return f"{cid}: sending result via {d.get('via')} on generation {d.get('generation')}"
            case "tool.result_sent":
                for s in reversed(c.sends):
                    if s.generation == d.get("generation") and not s.confirmed:
                        break
                else:
                    s = Send(d.get("generation"), d.get("via"), v, t)
                    c.sends.append(s)
                s.confirmed, s.confirmed_version, s.confirmed_at_us = True, v, t
                first = c.delivered_at_us is None
                if first:
                    c.delivered_at_us, c.delivered_via = t, d.get("via")
                    c.delivered_generation = d.get("generation")
                    c.delivery_ms = ms(c.finished_at_us, t)
                after = f", {c.delivery_ms:.0f} ms after the outcome" if (
                    first and c.delivery_ms is not None) else ""
                again = "" if first else " (sent again)"
                return (f"{cid}: result delivered via {d.get('via')} on generation "
                        f"{d.get('generation')}{after}{again}")
        self.problem(rec, "unknown_event_type", rec.type)
        return f"{rec.type} (unknown to this code)", "error"


def build_timeline(records: list[RecordedEvent], *, call_id: str = "", t0_us: int | None = None,
                   final_state: SessionState | None = None) -> Timeline:
    """The timeline of `records` (a whole call or a window of it, in version order).

    `t0_us` is the call's start (offsets are measured from it; default: the first record).
    With `final_state` (the fold of the whole call) each tool call says whether its result is
    in the model's current state, and the problems list what the call ended with.
    """
    b = _Builder(call_id, t0_us)
    for rec in records:
        b.add(rec)
    if b.tl is None:
        return Timeline(call_id, t0_us or 0, 0, 0, None, None)
    if b.episode is not None and (b.episode.requested_version or b.episode.disconnected_version):
        b.tl.reconnects.append(b.episode)  # still reconnecting at the end
    if final_state is not None:
        _final_findings(b.tl, final_state)
    return b.tl


def _final_findings(tl: Timeline, s: SessionState) -> None:
    at = {"version": s.version, "at_us": s.last_event_at_us}
    for cid, view in tl.tool_calls.items():
        call = s.calls.get(cid)
        if call is not None:
            view.in_model = s.in_model(call)
    for c in s.unanswered():
        what = ("its result never reached the model" if c.has_outcome
                else f"still {c.status}: no result yet")
        tl.problems.append({**at, "kind": "unanswered",
                            "detail": {"call_id": c.call_id, "name": c.name, "status": c.status,
                                       "why": what}})
    for c in s.in_doubt():
        tl.problems.append({**at, "kind": "in_doubt", "detail": {"call_id": c.call_id,
                                                                 "name": c.name}})
    lineage = s.lineage_cutoffs()
    for c in s.calls.values():
        n = times_held(lineage, c)
        if n > 1:
            tl.problems.append({**at, "kind": "delivered_more_than_once",
                                "detail": {"call_id": c.call_id, "sends_in_model": n}})
