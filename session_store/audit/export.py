"""What the tools show of stored data: the export line and the state view (pure).

Export format (JSON Lines, one event a line, `export_schema` 2; the model is
`models.ExportLine`, its JSON Schema docs/schemas/export-line.json):

    {"export_schema": 2, "call": …, "version": …, "position": …, "type": …,
     "schema_version": …, "recorded_at": ISO 8601 UTC, "recorded_at_us": int,
     "data": {… the stored payload, redacted …}, "hash": stored chain hash,
     "redacted": [JSON paths of masked values]}

(Schema 1 named the call `stream_id`; 2 calls it `call`, as every other output does.)
`data` is the payload as stored (not upcast), so an unredacted export can be re-hashed
offline: `hash` = chain_hash(previous hash, call, version, type, schema_version,
recorded_at_us, canonical_json(data)). A redacted line keeps the stored hash and says
which paths it masked, so nobody mistakes it for the original.
"""

from __future__ import annotations

from typing import Any

from ..lineage import lineage_cutoffs, times_held
from ..records import RecordedEvent
from ..state import SessionState
from .redaction import Redactor
from .fmt import iso

EXPORT_SCHEMA = 2


def export_line(rec: RecordedEvent, redactor: Redactor) -> dict[str, Any]:
    data, masked = redactor.redact_stored(rec)  # an unreadable payload: scrubbed, flagged
    return {"export_schema": EXPORT_SCHEMA, "call": rec.stream_id, "version": rec.version,
            "position": rec.position, "type": rec.type, "schema_version": rec.schema_version,
            "recorded_at": rec.recorded_at.isoformat(), "recorded_at_us": rec.recorded_at_us,
            "data": data, "hash": rec.hash, "redacted": masked}


def state_view(s: SessionState, call_id: str | None = None, *,
               max_items: int | None = None) -> dict[str, Any]:
    """The projection as support reads it (`models.State`, without its `event`): the
    headline facts, then every tool call in detail.

    With `max_items` (the web inspector), `tool_calls` holds every unsettled call plus the
    latest `max_items`, and `conversation` its latest `max_items` turns; `tool_calls_total`
    and `conversation_total` say how many there are. Not redacted: pass it through
    `Redactor.redact_state` before showing it.
    """
    lineage = lineage_cutoffs(s)
    times = {c.call_id: times_held(lineage, c) for c in s.calls.values()}
    to_send = [c.call_id for c in s.calls.values()
               if c.has_outcome and not c.superseded_by and not times[c.call_id]]

    def settled(c, depth: int = 0) -> bool:  # SessionState.settled, with the lineage walked once
        if c.superseded_by and depth < len(s.calls):
            return settled(s.calls[c.superseded_by], depth + 1)
        return c.status == "cancelled" or (c.has_outcome and times[c.call_id] > 0)

    unanswered = [c.call_id for c in s.calls.values() if not settled(c)]
    calls = list(s.calls.values())
    conversation = list(s.conversation)
    if max_items is not None:
        keep = set(unanswered) | {c.call_id for c in calls[-max_items:]}
        calls = [c for c in calls if c.call_id in keep]
        conversation = conversation[-max_items:]
    return {
        "call": call_id or s.stream_id, "version": s.version, "event": None,
        "opened": s.opened, "closed": s.closed, "model": s.model, "worker": s.worker,
        "epoch": s.epoch, "takeovers": s.takeovers, "generation": s.generation,
        "connected": s.connected, "bot_speaking": s.bot_speaking,
        "reconnect_pending": s.reconnect_pending, "reconnect_keys": list(s.reconnect_keys),
        "go_away_deadline": iso(s.go_away_deadline_us), "newest_handle": s.newest_handle,
        "reconnects": s.reconnects, "anomalies": s.anomalies,
        "last_event_at": iso(s.last_event_at_us) if s.last_event_at_us else None,
        "deferred": [c.call_id for c in s.pending()],
        "running": [c.call_id for c in s.running()],
        "in_doubt": [c.call_id for c in s.in_doubt()],
        "finished_after_end": [c.call_id for c in s.finished_after_end()],
        "to_send": to_send, "unanswered": unanswered,
        "settings": dict(s.settings),
        "tool_calls_total": len(s.calls),
        "tool_calls": [{
            "tool_call_id": c.call_id, "name": c.name, "status": c.status,
            "attempt": c.attempt, "args": c.args, "generation": c.generation,
            "requested_version": c.requested_version, "result": c.result, "error": c.error,
            "outcome_unknown": c.outcome_unknown, "checked": c.checked,
            "finished_after_end": c.finished_after_end, "reused_from": c.reused_from,
            "cancel_reason": c.cancel_reason, "reissue_of": c.reissue_of,
            "superseded_by": c.superseded_by, "in_current_session": times[c.call_id] > 0,
            "times_in_current_session": times[c.call_id],
            "sends": [{"generation": x.generation, "via": x.via, "version": x.version,
                       "confirmed": x.confirmed} for x in c.sends]}
            for c in calls],
        "handles": [{"handle": h.handle, "generation": h.generation, "version": h.version,
                     "issued_at": iso(h.issued_at_us),
                     "last_consumed_client_message_index": h.last_consumed_client_message_index}
                    for h in s.handles.values()],
        "generations": [{"generation": g.generation, "version": g.version, "handle": g.handle,
                         "parent": g.parent, "parent_cutoff": g.parent_cutoff}
                        for g in s.generations.values()],
        "conversation_total": len(s.conversation),
        "conversation": [{"role": role, "text": text} for role, text in conversation],
    }


def without_values(view: dict[str, Any]) -> dict[str, Any]:
    """A `state_view` without what its text (`text.state_view_text`) never shows: the
    conversation, and the tool calls' arguments, results and errors."""
    return {**view, "conversation": [], "tool_calls": [
        {**c, "args": None, "result": None, "error": None} for c in view["tool_calls"]]}
