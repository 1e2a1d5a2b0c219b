"""Builds a call's timeline event by event (`TimelineBuilder`) or whole (`build_timeline`).

A window of a long call states the same facts as the whole call: `prior` (the state just
before the window, and the event there) says what was going on when the window opens, and
`whole` (the whole call's state, with `evidence` from the whole call) says how each tool
call in the window ended. The window only chooses which events are listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...errors import CorruptEvent, SchemaVersionTooNew, UnknownEventType
from ...events import catalogue
from ...lineage import lineage_cutoffs, times_held
from ...records import RecordedEvent
from ...state import CallState, SessionState
from ..fmt import clip, ms
from .entries import Entry, Reconnect, Send, SpeechSegment, Timeline
from .evidence import Evidence, Prior, WholeCall, confirmed_sends
from .draft import TimelineDraft
from .kinds import KINDS, generic_summary, lane_of


class TimelineBuilder(TimelineDraft):
    """Builds a timeline one event at a time (`add`), then `finish`. Used whole by
    `build_timeline`, and event by event by `tail` and the live viewer."""

    def __init__(self, call_id: str, t0_us: int | None, prior: Prior | None = None):
        # Tool calls asked before the window: what was known of them when it opens.
        super().__init__(call_id, t0_us, prior.state.calls if prior is not None else {})
        self._speaking_before: SpeechSegment | None = None
        self._episode_before = False
        if prior is not None and prior.state.version:
            s = prior.state
            self.generation = s.generation or None
            self.seen_connect = bool(s.generation)
            self.closed_version = s.version if s.closed else None
            if s.bot_speaking:
                self._speaking_before = SpeechSegment(s.generation, None)
            down = s.opened and bool(s.generation) and not s.connected and not s.closed
            if prior.context:
                self._absorb(prior.context)
            if down or s.reconnect_pending:
                # A reconnect under way when the window opens: it began before it.
                if self.episode is None:
                    self.episode = Reconnect(reason=s.reconnect_pending,
                                             keys=list(s.reconnect_keys),
                                             from_generation=s.generation)
                self._episode_before = True
            self.worker, self.last = s.worker, prior.record  # (the context's, replaced)

    def _absorb(self, records: list[RecordedEvent]) -> None:
        """Take in events before the window as context (why a session is down), listing
        nothing: they go through their renderers into a timeline that is dropped."""
        self._tl = Timeline(self.call_id, self.t0_us or 0, 0, 0, None, None)
        for rec in records:
            try:
                d = rec.data
            except Exception:  # noqa: BLE001 - the row is reported where it is listed
                continue
            if isinstance(d, dict):
                self.describe(rec, d)
            self.last = rec
        self._tl = None

    # --------------------------------------------------------------- one event
    def add(self, rec: RecordedEvent) -> Entry:
        rec.recorded_at  # noqa: B018 - CorruptEvent for a time no entry could show
        if self._tl is None:
            t0 = self.t0_us if self.t0_us is not None else rec.recorded_at_us
            self._tl = Timeline(self.call_id or rec.stream_id, t0, rec.version, rec.version,
                               rec.recorded_at_us, rec.recorded_at_us)
            if self._speaking_before is not None:  # speaking when the window opened
                self.open_speech = self._speaking_before
                self.tl.speech.append(self.open_speech)
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
        call_id = d.get("call_id") if isinstance(d.get("call_id"), str) else None
        if self.closed_version is not None:
            self.problem(rec, "event_after_close", {"type": rec.type,
                                                    "closed_at_version": self.closed_version})
        level, summary = "info", self.describe(rec, d)
        if isinstance(summary, tuple):
            summary, level = summary
        if unreadable is not None:
            summary, level = f"UNREADABLE by this code: {summary}", "error"
        entry = Entry(v, rec.position, t, ms(tl.t0_us, t) or 0.0, rec.type, lane_of(rec.type),
                      level, summary, d, call_id)
        if rec.type == "session.worker_attached" and tl.takeovers \
                and tl.takeovers[-1].version == v:
            entry.flags.append(f"takeover_{tl.takeovers[-1].kind}")
            if self.last_entry is not None and self.last_entry.version == v - 1:
                self.last_entry.flags.append("last_of_worker")
        tl.entries.append(entry)
        self.last, self.last_entry = rec, entry
        return entry

    def describe(self, rec: RecordedEvent, d: dict[str, Any]):
        kind = KINDS.get(rec.type)
        if kind is not None:
            return kind.render(self, rec, d)
        if rec.type not in catalogue():
            self.problem(rec, "unknown_event_type", rec.type)
            return f"{rec.type} (unknown to this code): {clip(d)}", "error"
        if rec.type.startswith("tool.") and isinstance(d.get("call_id"), str):
            self.call(d["call_id"])  # a new kind of tool fact: the call is listed
        return generic_summary(rec, d)

    # --------------------------------------------------------------- the end
    def finish(self, whole: WholeCall | None = None, redact_state=None) -> Timeline:
        """The timeline; with `whole` every tool call listed states how it ended and whether
        its result is in the model, and the problems list what the call ended with.
        `redact_state` masks arguments and results taken from the final state
        (`Redactor.redact_state`)."""
        if self._tl is None:
            return Timeline(self.call_id, self.t0_us or 0, 0, 0, None, None)
        tl = self.tl
        if self.episode is not None and (self.episode.requested_version
                                         or self.episode.disconnected_version
                                         or self._episode_before):
            tl.reconnects.append(self.episode)  # still reconnecting at the end
            self.episode = None
        if whole is not None:
            tl.head = whole.state.version
            _from_final(tl, whole, redact_state)
            _final_findings(tl, whole.state)
        return tl


def build_timeline(records: Iterable[RecordedEvent], *, call_id: str = "",
                   t0_us: int | None = None, final_state: SessionState | None = None,
                   prior: Prior | None = None, whole: WholeCall | None = None,
                   redact_state=None) -> Timeline:
    """The timeline of `records` (a whole call or a window of it, in version order).

    `t0_us` is the call's start (offsets are measured from it; default: the first record).
    `prior`: the state before the window. `whole` (or just its `final_state`, for records
    that are the whole call: the signs of delivery are then found in them): the whole call's
    facts; with them each tool call says how it ended and whether its result is in the
    model, and the problems list what the call ended with.
    """
    records = list(records)
    b = TimelineBuilder(call_id, t0_us, prior)
    if whole is None and final_state is not None:
        whole = WholeCall(final_state)
        if records and records[0].version == 1:
            whole.evidence = Evidence(confirmed_sends(final_state))
            for rec in records:
                whole.evidence.feed(rec)
    for rec in records:
        b.add(rec)
    return b.finish(whole, redact_state)


# ------------------------------------------------------------------------ facts from the end

def _from_final(tl: Timeline, whole: WholeCall, redact_state) -> None:
    """Each listed tool call's facts from the whole call's state: a window that ends before
    the result was sent must not say "not sent"."""
    s, evidence = whole.state, whole.evidence
    lineage = lineage_cutoffs(s)
    content: dict[str, dict[str, Any]] = {}
    valued = values_from_final(tl, s)
    for cid, view in tl.tool_calls.items():
        c = s.calls.get(cid)
        if c is None:
            continue
        view.name, view.generation = c.name, c.generation
        view.requested_version, view.requested_at_us = c.requested_version, c.requested_at_us
        view.deferred = (view.deferred or c.status == "deferred"
                         or (whole.deferred is not None and cid in whole.deferred))
        if view.started_at_us is None and c.started_at_us is not None:
            view.started_at_us = c.started_at_us
        if view.wait_ms is None and view.started_at_us is not None:
            view.wait_ms = ms(c.requested_at_us, view.started_at_us)
        view.outcome = c.status if c.status in ("completed", "failed", "cancelled") else None
        view.outcome_unknown, view.reused_from = c.outcome_unknown, c.reused_from
        view.reissue_of, view.superseded_by = c.reissue_of, c.superseded_by
        view.cancel_reason = c.cancel_reason
        if c.finished_at_us is not None:
            view.finished_at_us = c.finished_at_us
            if view.run_ms is None and c.started_at_us is not None and not c.reused_from:
                view.run_ms = ms(c.started_at_us, c.finished_at_us)
        if cid in valued:
            content[cid] = {"args": c.args, "result": c.result, "error": c.error}
        by_version = {x.version: x for x in view.sends}
        sends = []
        for x in c.sends:
            seen = by_version.get(x.version)
            sends.append(Send(x.generation, x.via, x.version,
                              seen.at_us if seen else None, x.confirmed,
                              seen.confirmed_version if seen else None,
                              x.at_us if x.confirmed else None))
        view.sends = sends
        first = next((x for x in sends if x.confirmed), None)
        view.sent_at_us = first.confirmed_at_us if first else None
        view.sent_via = first.via if first else None
        view.sent_generation = first.generation if first else None
        view.send_ms = ms(view.finished_at_us, view.sent_at_us) if first else None
        view.in_model, view.in_model_evidence = _in_model(s, lineage, c, evidence)
    if content:
        masked = content if redact_state is None else (
            redact_state({"calls": content}).get("calls") or content)
        for cid, values in masked.items():
            view = tl.tool_calls[cid]
            if view.args is None:
                view.args = values.get("args")
            if view.outcome and view.result is None and view.error is None:
                view.result, view.error = values.get("result"), values.get("error")


def values_from_final(tl: Timeline, s: SessionState) -> set[str]:
    """The tool calls listed whose arguments, result and error `finish` takes from the
    final state `s`: those asked for before the window, and those ended after it."""
    return {cid for cid, view in tl.tool_calls.items() if (c := s.calls.get(cid)) is not None
            and (view.clipped or c.status in ("completed", "failed", "cancelled")
                 and view.finished_version is None)}


def _in_model(s: SessionState, lineage, c: CallState, evidence: Evidence | None):
    if c.superseded_by and c.superseded_by in s.calls:
        return None, None  # answered through the id that re-asked for it
    held = [x for x in c.sends if x.confirmed and x.generation in lineage
            and (lineage[x.generation] is None or x.version < lineage[x.generation])]
    if not held:
        return (False if c.has_outcome else None), None
    if evidence is None:
        return None, None
    for x in held:
        sign = evidence.found.get((c.call_id, x.generation, x.version))
        if sign is not None:
            return True, sign
    return None, None


def unreadable_call(version: int, why: str) -> dict[str, Any]:
    """The problem a window states when the whole call cannot be folded: its tool calls and
    takeovers are then only what the window itself shows."""
    return {"version": version, "at_us": None, "kind": "whole_call_unreadable",
            "detail": f"facts are this window's only: the call cannot be read whole ({why})"}


def _final_findings(tl: Timeline, s: SessionState) -> None:
    at = {"version": s.version, "at_us": s.last_event_at_us}
    lineage = lineage_cutoffs(s)  # (walked once: a call can have thousands of tool calls)
    times = {c.call_id: times_held(lineage, c) for c in s.calls.values()}

    def settled(c: CallState, depth: int = 0) -> bool:  # SessionState.settled
        if c.superseded_by and c.superseded_by in s.calls and depth < len(s.calls):
            return settled(s.calls[c.superseded_by], depth + 1)
        return c.status == "cancelled" or (c.has_outcome and times[c.call_id] > 0)

    for c in s.calls.values():
        if settled(c):
            continue
        what = ("no send of its result is in the model's current state" if c.has_outcome
                else f"still {c.status}: no result yet")
        tl.problems.append({**at, "kind": "unanswered",
                            "detail": {"tool_call_id": c.call_id, "name": c.name,
                                       "status": c.status, "why": what}})
    for c in s.in_doubt():
        tl.problems.append({**at, "kind": "in_doubt", "detail": {"tool_call_id": c.call_id,
                                                                 "name": c.name}})
    for c in s.calls.values():
        if times[c.call_id] > 1:
            tl.problems.append({**at, "kind": "sent_more_than_once",
                                "detail": {"tool_call_id": c.call_id,
                                           "sends_in_model": times[c.call_id]}})


def tool_calls_in(records: Iterable[RecordedEvent]) -> set[str]:
    """The tool call ids a window of events names (and the calls they re-ask for)."""
    ids: set[str] = set()
    for rec in records:
        if not rec.type.startswith("tool."):
            continue
        try:
            d = rec.data
        except Exception:  # noqa: BLE001 - shown as a problem by the builder
            continue
        if isinstance(d, dict):
            ids |= {v for k in ("call_id", "original", "reused_from")
                    if isinstance(v := d.get(k), str)}
    return ids
