"""The projection: a call's state as the fold of its events (pure; no I/O).

`evolve(state, event)` returns a new state; `fold(events)` folds many. Snapshots are a cache
of this fold (`to_snapshot` / `from_snapshot`): `PROJECTION_VERSION` changes whenever the fold
changes meaning, and a snapshot from another version is ignored, so it never changes an answer.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from . import events as ev
from .records import RecordedEvent

PROJECTION_VERSION = 3
HANDLE_TTL_US = 2 * 3600 * 1_000_000  # Gemini keeps a resumption handle ~2 h

OUTCOMES = ("completed", "failed")


@dataclass
class Send:
    generation: int
    via: str
    version: int  # log version of the event: orders the send against handles
    confirmed: bool = False
    at_us: int = 0  # when the send was confirmed


@dataclass
class CallState:
    call_id: str
    name: str
    args: dict[str, Any]
    generation: int
    requested_version: int
    requested_at_us: int
    # requested|deferred|started|completed|failed|cancelled, or awaiting (a re-issued id
    # waiting for its original's outcome)
    status: str = "requested"
    attempt: int = 0
    idempotency_key: str | None = None
    started_epoch: int | None = None
    started_at_us: int | None = None
    finished_at_us: int | None = None
    result: Any = None
    error: str | None = None
    outcome_unknown: bool = False
    reused_from: str | None = None
    cancel_reason: str | None = None
    reissue_of: str | None = None  # this id re-asks for that call: it gets that outcome
    superseded_by: str | None = None  # the model now knows this call by that id
    sends: list[Send] = field(default_factory=list)

    @property
    def has_outcome(self) -> bool:
        return self.status in OUTCOMES


@dataclass
class Generation:
    generation: int
    version: int
    handle: str | None  # the handle it resumed from; None = fresh
    parent: int | None  # generation whose state it resumed
    parent_cutoff: int | None  # log version of that handle: state as of then


@dataclass
class Handle:
    handle: str
    generation: int
    version: int
    issued_at_us: int
    last_consumed_client_message_index: int | None = None


@dataclass
class SessionState:
    stream_id: str = ""
    version: int = 0
    last_event_at_us: int = 0
    opened: bool = False
    closed: bool = False
    model: str = ""
    tools: list[str] = field(default_factory=list)
    worker: str | None = None
    epoch: int = 0
    takeovers: int = 0
    bot_speaking: bool = False
    generation: int = 0
    connected: bool = False
    generations: dict[int, Generation] = field(default_factory=dict)
    handles: dict[str, Handle] = field(default_factory=dict)
    newest_handle: str | None = None
    reconnect_pending: str | None = None
    reconnect_keys: list[str] = field(default_factory=list)
    go_away_deadline_us: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    calls: dict[str, CallState] = field(default_factory=dict)
    # The conversation in log order: (role, text) for user/assistant turns and
    # ("tool", call_id) where a call was made; a fresh session is seeded from it.
    conversation: list[tuple[str, str]] = field(default_factory=list)
    anomalies: int = 0
    reconnects: int = 0

    # ---------------------------------------------------------------- derived views
    def pending(self) -> list[CallState]:
        """Deferred calls, in request order: they start when the bot stops speaking."""
        return [c for c in self.calls.values() if c.status == "deferred"]

    def in_doubt(self) -> list[CallState]:
        """Started by an earlier worker and never finished: the outcome is unknown."""
        return [c for c in self.calls.values()
                if c.status == "started" and (c.started_epoch or 0) < self.epoch]

    def running(self) -> list[CallState]:
        return [c for c in self.calls.values()
                if c.status == "started" and (c.started_epoch or 0) >= self.epoch]

    def undelivered(self) -> list[CallState]:
        """Calls with an outcome the current model state does not hold (a superseded call
        is answered through the id that re-asked for it)."""
        return [c for c in self.calls.values()
                if c.has_outcome and not c.superseded_by and not self.in_model(c)]

    def unanswered(self) -> list[CallState]:
        """Every call not yet settled (I1: each ends delivered or cancelled)."""
        return [c for c in self.calls.values() if not self.settled(c)]

    def settled(self, call: CallState) -> bool:
        if call.superseded_by:
            return self.settled(self.calls[call.superseded_by])
        return call.status == "cancelled" or (call.has_outcome and self.in_model(call))

    def _lineage(self):
        """(generation, cutoff version) pairs whose model state the current session holds."""
        gen, cutoff = self.generation, None
        seen = set()
        while gen and gen not in seen:
            seen.add(gen)
            yield gen, cutoff
            info = self.generations.get(gen)
            if info is None or info.parent is None:
                return
            gen, cutoff = info.parent, info.parent_cutoff

    def in_model(self, call: CallState) -> bool:
        """Does the current session's model state hold this call's result (delivery rules)?"""
        for gen, cutoff in self._lineage():
            for s in call.sends:
                if s.confirmed and s.generation == gen and (cutoff is None or s.version < cutoff):
                    return True
        return False

    def session_knows_call(self, call: CallState) -> bool:
        """Did the current session (or the state it resumed) issue this call id?"""
        for gen, cutoff in self._lineage():
            if call.generation == gen and (cutoff is None or call.requested_version < cutoff):
                return True
        return False

    def unconfirmed_sends(self) -> list[tuple[CallState, Send]]:
        return [(c, s) for c in self.calls.values() for s in c.sends if not s.confirmed]

    def find_equivalent(self, name: str, args: dict[str, Any],
                        crossing_window_us: int = 0) -> CallState | None:
        """An earlier call with the same name and arguments that Gemini is re-asking for:
        its answer is not in the current model state — or it reached this session only as
        content within `crossing_window_us` of now, so the new request may have crossed it
        on the wire (the model asked before it read the answer). None otherwise."""
        for c in self.calls.values():
            if (c.name == name and c.args == args and c.status != "cancelled"
                    and not c.superseded_by
                    and (not self.in_model(c) or self._crossed(c, crossing_window_us))):
                return c
        return None

    def _crossed(self, call: CallState, window_us: int) -> bool:
        sends = [s for s in call.sends if s.confirmed and s.generation == self.generation]
        return bool(sends) and all(s.via != "tool_response" for s in sends) and any(
            self.last_event_at_us - s.at_us <= window_us for s in sends)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["conversation"] = [list(m) for m in self.conversation]
        return data


# ------------------------------------------------------------------------- the fold

def _apply(s: SessionState, rec: RecordedEvent) -> None:
    """Apply one event in place (private: callers use evolve/fold, which never mutate)."""
    e = rec.event
    s.version, s.stream_id, s.last_event_at_us = rec.version, rec.stream_id, rec.recorded_at_us
    match e:
        case ev.SessionOpened():
            s.opened, s.model, s.tools = True, e.model, list(e.tools)
            s.worker, s.epoch, s.settings = e.worker, e.epoch, dict(e.settings)
        case ev.WorkerAttached():
            s.worker, s.epoch = e.worker, max(s.epoch, e.epoch)
            s.takeovers += 1
            # The old worker's live session and speech died with it.
            s.connected, s.bot_speaking = False, False
        case ev.SessionClosed():
            s.closed, s.connected, s.bot_speaking = True, False, False
        case ev.Connected():
            parent = s.handles.get(e.handle) if e.handle else None
            s.generations[e.generation] = Generation(
                e.generation, rec.version, e.handle,
                parent.generation if parent else None, parent.version if parent else None)
            if s.generation:
                s.reconnects += 1
            s.generation, s.connected = e.generation, True
            s.reconnect_pending, s.reconnect_keys, s.go_away_deadline_us = None, [], None
            s.bot_speaking = False
        case ev.Disconnected():
            if e.generation == s.generation:
                s.connected, s.bot_speaking = False, False
        case ev.HandleIssued():
            s.handles[e.handle] = Handle(e.handle, e.generation, rec.version, rec.recorded_at_us,
                                         e.last_consumed_client_message_index)
            s.newest_handle = e.handle
        case ev.GoAwayReceived():
            s.go_away_deadline_us = rec.recorded_at_us + int(e.time_left_s * 1e6)
            s.reconnect_pending = s.reconnect_pending or "go_away"
        case ev.ReconnectRequested():
            s.reconnect_pending = e.reason
            s.reconnect_keys = sorted(set(s.reconnect_keys) | set(e.keys))
        case ev.BotStartedSpeaking():
            s.bot_speaking = True
        case ev.BotStoppedSpeaking() | ev.Interrupted():
            s.bot_speaking = False
        case ev.SettingsChanged():
            s.settings.update(e.values)
        case ev.ToolCallRequested():
            s.calls[e.call_id] = CallState(e.call_id, e.name, dict(e.args), e.generation,
                                           rec.version, rec.recorded_at_us)
            s.conversation.append(("tool", e.call_id))
        case ev.ToolCallReissued():
            new, original = s.calls[e.call_id], s.calls[e.original]
            new.reissue_of, original.superseded_by = original.call_id, new.call_id
            new.status = "awaiting"  # answered when the original has an outcome
            _inherit_outcome(s, original)
        case ev.ToolCallDeferred():
            call = s.calls[e.call_id]
            if call.status == "requested":
                call.status = "deferred"
        case ev.ToolCallStarted():
            call = s.calls[e.call_id]
            call.status, call.attempt = "started", e.attempt
            call.idempotency_key, call.started_epoch = e.idempotency_key, e.epoch
            call.started_at_us = rec.recorded_at_us
        case ev.ToolCallCompleted():
            call = s.calls[e.call_id]
            if call.status != "cancelled":
                call.status, call.result, call.reused_from = "completed", e.result, e.reused_from
            call.finished_at_us = rec.recorded_at_us
            _inherit_outcome(s, call)
        case ev.ToolCallFailed():
            call = s.calls[e.call_id]
            if call.status != "cancelled":
                call.status, call.error = "failed", e.error
                call.outcome_unknown = e.outcome_unknown
            call.finished_at_us = rec.recorded_at_us
            _inherit_outcome(s, call)
        case ev.ToolCallCancelled():
            call = s.calls[e.call_id]
            call.status, call.cancel_reason = "cancelled", e.reason
        case ev.ToolResultSending():
            s.calls[e.call_id].sends.append(Send(e.generation, e.via, rec.version))
        case ev.ToolResultSent():
            call = s.calls[e.call_id]
            for send in reversed(call.sends):
                if send.generation == e.generation and not send.confirmed:
                    send.confirmed, send.at_us = True, rec.recorded_at_us
                    break
            else:  # a confirmation without its intent (older logs): the send itself
                call.sends.append(Send(e.generation, e.via, rec.version, confirmed=True,
                                       at_us=rec.recorded_at_us))
        case ev.ConversationMessage():
            s.conversation.append((e.role, e.text))
        case ev.AnomalyRecorded():
            s.anomalies += 1


def _inherit_outcome(s: SessionState, original: CallState) -> None:
    """A re-issued id takes its original's outcome as soon as there is one."""
    if not original.superseded_by or not original.has_outcome:
        return
    new = s.calls[original.superseded_by]
    if new.status == "awaiting":
        new.status, new.result, new.error = original.status, original.result, original.error
        new.outcome_unknown, new.reused_from = original.outcome_unknown, original.call_id
        new.finished_at_us = original.finished_at_us
        _inherit_outcome(s, new)


def evolve(state: SessionState, event: RecordedEvent) -> SessionState:
    """The state after one more event. Does not modify `state`."""
    new = copy.deepcopy(state)
    _apply(new, event)
    return new


def fold(recorded: Iterable[RecordedEvent], state: SessionState | None = None) -> SessionState:
    """Fold events onto `state` (or the empty state). Does not modify `state`."""
    return fold_into(copy.deepcopy(state) if state is not None else SessionState(), recorded)


def fold_into(state: SessionState, recorded: Iterable[RecordedEvent]) -> SessionState:
    """Fold events into `state` in place: for the one owner of a private working state
    (the service's driver), which would otherwise copy the whole state per event."""
    for rec in recorded:
        if rec.version != state.version + 1:
            raise ValueError(f"fold of {rec.stream_id}: expected version {state.version + 1}, "
                             f"got {rec.version} (gap or reorder in the stream)")
        _apply(state, rec)
    return state


# ------------------------------------------------------------------------- snapshots

def to_snapshot(state: SessionState) -> str:
    return json.dumps(state.to_json(), sort_keys=True, separators=(",", ":"))


def from_snapshot(text: str) -> SessionState:
    data = json.loads(text)
    data["calls"] = {k: CallState(**{**c, "sends": [Send(**x) for x in c["sends"]]})
                     for k, c in data["calls"].items()}
    data["generations"] = {int(k): Generation(**g) for k, g in data["generations"].items()}
    data["handles"] = {k: Handle(**h) for k, h in data["handles"].items()}
    data["conversation"] = [tuple(m) for m in data["conversation"]]
    return SessionState(**data)
