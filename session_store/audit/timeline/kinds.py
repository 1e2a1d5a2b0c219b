"""How each event type is shown: one table, `KINDS` (lane, one-line summary, swimlane mark).

Adding a type is one entry. A summary function takes the draft (whose views of tool
calls, speech and reconnects it updates), the record and its data, and returns the text
or (text, level). A catalogue type without an entry is shown generically
(`generic_summary`); a type the catalogue does not know is flagged by the builder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...events import catalogue
from ...records import RecordedEvent
from ..fmt import clip, ms, words
from . import tool_kinds
from .draft import TimelineDraft, bounded
from .entries import LETTING_GO, PLANNED_REASONS, SpeechSegment, Takeover


Renderer = Callable[[TimelineDraft, RecordedEvent, dict[str, Any]], Any]


@dataclass(frozen=True)
class Kind:
    """How one event type is shown: its lane, its one-line summary (a function returning the
    text or (text, level)), and its mark on the swimlanes (line | dot | diamond | big |
    None: drawn by the lane itself, as speech and tool bars are)."""
    lane: str
    render: Renderer
    mark: str | None = "dot"


def lane_of(event_type: str) -> str:
    kind = KINDS.get(event_type)
    if kind is not None:
        return kind.lane
    if event_type not in catalogue():
        return "errors"
    return _LANE_BY_PREFIX.get(event_type.split(".", 1)[0], "other")


_LANE_BY_PREFIX = {"session": "session", "connection": "connection", "speech": "speech",
                   "settings": "settings", "tool": "tools", "conversation": "conversation",
                   "anomaly": "errors", "context": "conversation", "interaction": "speech"}




def generic_summary(rec: RecordedEvent, d: dict[str, Any]) -> str:
    """A catalogue type this table has no entry for: its name and fields, clipped."""
    fields = ", ".join(f"{k} {clip(v, 40)}" for k, v in list(d.items())[:8])
    return clip(f"{rec.type}: {fields}" if fields else rec.type, 160)


def _opened(b: TimelineDraft, rec, d):
    b.worker = d.get("worker")
    return (f"session opened: model {words(d.get('model'))}, tools {words(d.get('tools'))}, "
            f"worker {words(d.get('worker'))}, epoch {words(d.get('epoch'))}")


def _attached(b: TimelineDraft, rec, d):
    b.end_speech(rec, "takeover")
    last = b.last
    kind = "planned" if (d.get("reason") in PLANNED_REASONS or (
        last is not None and last.type == "connection.disconnected"
        and _field(last, "reason") in LETTING_GO)) else "crash"
    t = Takeover(rec.version, rec.recorded_at_us, d.get("worker"), d.get("epoch"),
                 d.get("reason"), kind, b.worker,
                 last.version if last else None, last.recorded_at_us if last else None,
                 last.type if last else None,
                 ms(last.recorded_at_us, rec.recorded_at_us) if last else None)
    b.tl.takeovers.append(t)
    b.takeover_pending, b.worker = True, d.get("worker")
    silence = (f" after {t.silent_ms / 1000:.2f} s of silence since v{t.last_event_version}"
               if t.silent_ms is not None else "")
    what = "planned hand-over" if kind == "planned" else "crash"
    return (f"worker {words(d.get('worker'))} took the call over from "
            f"{words(t.previous_worker)} ({what}{silence}; epoch {words(d.get('epoch'))})",
            "warn")


def _field(rec: RecordedEvent, key: str) -> Any:
    try:
        d = rec.data
    except Exception:  # noqa: BLE001 - an unreadable row has no fields (shown as a problem)
        return None
    return d.get(key) if isinstance(d, dict) else None


def _closed(b: TimelineDraft, rec, d):
    b.end_speech(rec, "closed")
    b.closed_version = rec.version
    return f"session closed: {words(d.get('reason'))}"


def _connected(b: TimelineDraft, rec, d):
    t, v = rec.recorded_at_us, rec.version
    gen, handle = d.get("generation"), d.get("handle")
    how = f"resumed from handle {clip(handle, 40)}" if handle else "fresh (seeded history)"
    b.end_speech(rec, "reconnected")
    if b.seen_connect or b.episode is not None or b.takeover_pending:
        e = b.ep()
        if e.reason is None:
            e.reason = "takeover" if b.takeover_pending else "connection_lost"
        e.connected_version, e.connected_at_us, e.generation = v, t, gen
        e.resumed_handle = handle
        e.downtime_ms = ms(e.disconnected_at_us, t)
        b.tl.reconnects.append(e)
        summary = f"reconnected: generation {words(gen)}, {how} (reason: {e.reason})"
    else:
        summary = f"connected: generation {words(gen)}, {how}"
    b.episode, b.generation, b.seen_connect = None, gen, True
    b.takeover_pending = False
    return summary


def _disconnected(b: TimelineDraft, rec, d):
    if d.get("generation") == b.generation:
        b.end_speech(rec, "disconnected")
    e = b.ep()
    e.disconnected_version, e.disconnected_at_us = rec.version, rec.recorded_at_us
    e.disconnect_reason, e.detail = d.get("reason"), clip(d.get("detail", ""), 200)
    e.from_generation = d.get("generation")
    e.reason = e.reason or d.get("reason")
    e.waited_ms = ms(e.requested_at_us, rec.recorded_at_us)
    bad = d.get("reason") in ("error", "handshake_failed")
    if bad:
        b.problem(rec, f"disconnected:{d.get('reason')}", clip(d.get("detail", ""), 500))
    detail = f" ({clip(d.get('detail'), 80)})" if d.get("detail") else ""
    return (f"disconnected generation {words(d.get('generation'))}: {words(d.get('reason'))}"
            f"{detail}", "error" if bad else "warn")


def _handle_issued(b: TimelineDraft, rec, d):
    b.tl.handles.append({"version": rec.version, "at_us": rec.recorded_at_us,
                         "generation": d.get("generation"), "handle": d.get("handle"),
                         "last_consumed_client_message_index":
                             d.get("last_consumed_client_message_index")})
    idx = d.get("last_consumed_client_message_index")
    return (f"resumption handle {clip(d.get('handle'), 40)} issued on generation "
            f"{words(d.get('generation'))}"
            + (f" (last consumed message {idx})" if idx is not None else ""))


def _handle_withheld(b: TimelineDraft, rec, d):
    return (f"resumption handle {clip(d.get('handle'), 40)} withheld on generation "
            f"{words(d.get('generation'))} (it may predate content just sent)", "warn")


def _send_unread(b: TimelineDraft, rec, d):
    turn = "; a model turn under way, its next turn reacts" if d.get("turn_under_way") else ""
    return (f"generation {words(d.get('generation'))}: content going out the model has not "
            f"read yet: its handles are withheld until it reacts{turn}")


def _earlier_turn_ended(b: TimelineDraft, rec, d):
    return (f"generation {words(d.get('generation'))}: the model turn under way at the send "
            "ended: its next output reacts to what was sent")


def _model_reacted(b: TimelineDraft, rec, d):
    return (f"generation {words(d.get('generation'))}: the model reacted to what was sent: "
            "its handles are issued again")


def _holds_all(b: TimelineDraft, rec, d):
    return (f"generation {words(d.get('generation'))} holds all it was told: its handles "
            "are issued")


def _handle_refused(b: TimelineDraft, rec, d):
    why = ("the server refused to resume from it (expired or unknown)"
           if d.get("reason") == "refused" else
           f"{words(d.get('failures'))} handshakes in a row failed with it")
    return (f"resumption handle {clip(d.get('handle'), 40)} (generation "
            f"{words(d.get('generation'))}) passed over for good: {why}; the next session "
            "resumes from an older handle or starts fresh", "warn")


def _go_away(b: TimelineDraft, rec, d):
    e = b.ep()
    e.reason = e.reason or "go_away"
    e.go_away_time_left_s = d.get("time_left_s")
    e.requested_version = e.requested_version or rec.version
    e.requested_at_us = e.requested_at_us or rec.recorded_at_us
    return (f"goAway on generation {words(d.get('generation'))}: "
            f"{words(d.get('time_left_s'))} s left", "warn")


def _reconnect_requested(b: TimelineDraft, rec, d):
    e = b.ep()
    e.reason = d.get("reason")
    e.keys = [str(k) for k in (d.get("keys") or [])] if isinstance(d.get("keys"), list) else []
    e.requested_version, e.requested_at_us = rec.version, rec.recorded_at_us
    keys = f" ({words(e.keys)})" if e.keys else ""
    return f"reconnect requested: {words(d.get('reason'))}{keys}; buffered until turn end"


def _bot_started(b: TimelineDraft, rec, d):
    if b.open_speech is not None:  # a second start: close the first
        b.end_speech(rec, "restarted")
    b.open_speech = SpeechSegment(d.get("generation"), rec.recorded_at_us,
                                  start_version=rec.version)
    b.tl.speech.append(b.open_speech)
    return f"bot started speaking (generation {words(d.get('generation'))})"


def _bot_stopped(b: TimelineDraft, rec, d):
    src = d.get("source", "interruption") if rec.type == "speech.bot_stopped" else "interruption"
    if b.open_speech is None:
        seg = SpeechSegment(d.get("generation"), None)
        b.tl.speech.append(seg)
        b.open_speech = seg
    seg = b.open_speech
    b.end_speech(rec, src)
    took = f" after {seg.duration_ms / 1000:.1f} s" if seg.duration_ms is not None else ""
    if rec.type == "speech.interrupted":
        return f"bot interrupted{took}", "warn"
    return f"bot stopped speaking ({words(src)}){took}"


def _settings(b: TimelineDraft, rec, d):
    b.tl.settings.append({"version": rec.version, "at_us": rec.recorded_at_us,
                          "keys": d.get("keys"), "values": d.get("values"),
                          "needs_reconnect": d.get("needs_reconnect")})
    vals = f" = {clip(d.get('values'), 80)}" if d.get("values") else ""
    return (f"settings changed: {words(d.get('keys'))}{vals}"
            + ("; needs a reconnect" if d.get("needs_reconnect") else "")
            + ("; applied in-session (contextUpdate)" if d.get("in_session") else ""))


def _context_sending(b: TimelineDraft, rec, d):
    return (f"sending the settings as of v{words(d.get('version'))} as a contextUpdate on "
            f"generation {words(d.get('generation'))}")


def _context_sent(b: TimelineDraft, rec, d):
    return (f"contextUpdate (settings as of v{words(d.get('version'))}) sent on generation "
            f"{words(d.get('generation'))}")


def _conversation_sending(b: TimelineDraft, rec, d):
    what = ("seeding it with the conversation" if d.get("via") == "seed" else
            "telling it, as content, the turns its handle lacks")
    return (f"generation {words(d.get('generation'))}: {what} (up to "
            f"v{words(d.get('through'))})")


def _conversation_sent(b: TimelineDraft, rec, d):
    what = "seed" if d.get("via") == "seed" else "turns its handle lacked"
    return (f"generation {words(d.get('generation'))}: {what} sent (up to "
            f"v{words(d.get('through'))})")


def _interaction(b: TimelineDraft, rec, d):
    status = d.get("status")
    why = " (no word from it for long: taken as idle)" if d.get("source") == "timeout" else ""
    doing = ("working (more may follow a turnComplete)" if status == "IN_PROGRESS"
             else "idle")
    return (f"model {doing}: interaction status {words(status)} on generation "
            f"{words(d.get('generation'))}{why}")


def _message(b: TimelineDraft, rec, d):
    return f"{words(d.get('role'))}: {clip(d.get('text'), 120)}"


def _message_cut(b: TimelineDraft, rec, d):
    return f"the caller heard the bot's last message only as: {clip(d.get('text'), 100)}", "warn"


def _cut_note(b: TimelineDraft, rec, d):
    """The note about a cut turn owed to the session that said it: intent, sent, or not."""
    where = f"generation {words(d.get('generation'))}"
    cut = f"the turn cut at v{words(d.get('cut'))}"
    if rec.type == "conversation.cut_untold":
        return f"{where} not told of {cut}: {clip(d.get('reason'), 100)}", "warn"
    if d.get("via") == "reseed":
        return (f"{where} to be replaced by a fresh session seeded with what the caller heard "
                f"of {cut}")
    done = "told" if rec.type == "conversation.cut_told" else "to be told"
    return f"{where} {done} what the caller heard of {cut} (via {words(d.get('via'))})"


def _anomaly(b: TimelineDraft, rec, d):
    b.problem(rec, f"anomaly:{d.get('kind')}", bounded(d.get("detail")))
    return f"anomaly {words(d.get('kind'))}: {clip(d.get('detail'), 100)}", "error"


def _observed(b: TimelineDraft, rec, d):
    n = d.get("events")
    return (f"decided on {words(d.get('kind'))}: the next {words(n)} "
            f"event{'s' if n != 1 else ''}" + (" (observation withheld)"
                                               if d.get("withheld") else ""))


#: Every event type's lane, summary and swimlane mark: adding a type is one entry here.
KINDS: dict[str, Kind] = {
    "session.opened": Kind("session", _opened, "line"),
    "session.worker_attached": Kind("session", _attached, "big"),
    "session.closed": Kind("session", _closed, "line"),
    "connection.connected": Kind("connection", _connected, "line"),
    "connection.disconnected": Kind("connection", _disconnected, "line"),
    "connection.handle_issued": Kind("connection", _handle_issued),
    "connection.handle_withheld": Kind("connection", _handle_withheld),
    "connection.handle_refused": Kind("connection", _handle_refused),
    # The handles' gate (withholding.py): bookkeeping, not drawn on the swimlanes.
    "connection.send_unread": Kind("connection", _send_unread, None),
    "connection.earlier_turn_ended": Kind("connection", _earlier_turn_ended, None),
    "connection.model_reacted": Kind("connection", _model_reacted, None),
    "connection.holds_all": Kind("connection", _holds_all, None),
    "connection.go_away": Kind("connection", _go_away),
    "connection.reconnect_requested": Kind("connection", _reconnect_requested),
    "speech.bot_started": Kind("speech", _bot_started, None),
    "speech.bot_stopped": Kind("speech", _bot_stopped, None),
    "speech.interrupted": Kind("speech", _bot_stopped, None),
    "settings.changed": Kind("settings", _settings, "diamond"),
    "settings.context_sending": Kind("settings", _context_sending),
    "settings.context_sent": Kind("settings", _context_sent),
    "model.interaction_status": Kind("speech", _interaction),
    "conversation.sending": Kind("conversation", _conversation_sending),
    "conversation.sent": Kind("conversation", _conversation_sent),
    "conversation.message": Kind("conversation", _message),
    "conversation.message_cut": Kind("conversation", _message_cut),
    "conversation.cut_telling": Kind("conversation", _cut_note),
    "conversation.cut_told": Kind("conversation", _cut_note),
    "conversation.cut_untold": Kind("conversation", _cut_note),
    "anomaly.recorded": Kind("errors", _anomaly, "big"),
    "tool.call_requested": Kind("tools", tool_kinds.requested, None),
    "tool.call_progress": Kind("tools", tool_kinds.progress, None),
    "tool.call_reissued": Kind("tools", tool_kinds.reissued, None),
    "tool.call_deferred": Kind("tools", tool_kinds.deferred, None),
    "tool.call_started": Kind("tools", tool_kinds.started, None),
    "tool.call_completed": Kind("tools", tool_kinds.completed, None),
    "tool.call_failed": Kind("tools", tool_kinds.failed, None),
    "tool.call_cancelled": Kind("tools", tool_kinds.cancelled, None),
    "tool.outcome_checked": Kind("tools", tool_kinds.checked, None),
    "tool.result_sending": Kind("tools", tool_kinds.sending, None),
    "tool.result_sent": Kind("tools", tool_kinds.sent, None),
    "decision.observed": Kind("other", _observed, None),
}
