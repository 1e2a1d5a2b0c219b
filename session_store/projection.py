"""The projection: a call's state as the fold of its events (pure; no I/O).

`evolve(state, event)` returns a new state; `fold(events)` folds many. Snapshots are a cache
of this fold (`to_snapshot` / `from_snapshot`): `PROJECTION_VERSION` changes whenever the fold
changes meaning, and a snapshot from another version is ignored, so it never changes an answer.

`compact(state)` is what a snapshot stores: the *decision* state, bounded however long the
call. It leaves out what no decision can need again — calls settled for good (archived by id
only), handles that can never be chosen, generations outside every lineage still reachable —
and the conversation, which only seeding a fresh session needs: a compacted state says so
(`history_complete = False`), and whoever needs the history (seeding) loads the whole log
(`HistoryNeeded`). Decisions on a compacted state equal those on the full fold
(tests/store/test_compaction.py).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from . import events as ev
from .errors import CorruptEvent, EventDecodeError, StreamDamaged
from .records import RecordedEvent

PROJECTION_VERSION = 6
HANDLE_TTL_US = 2 * 3600 * 1_000_000  # Gemini keeps a resumption handle ~2 h
# A call answered as content this recently may have crossed a re-ask on the wire
# (decide.Policy.crossing_window_s): compaction keeps such calls whatever the window.
CROSSING_WINDOW_US = 10 * 1_000_000


class HistoryNeeded(LookupError):
    """The state was compacted (loaded from a snapshot) and this needs what compaction left
    out: the conversation, or a call archived as settled for good. Load the whole log."""

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
    # A reconnect asked for while no session was up (between a Disconnected and the next
    # Connected): the session that comes up may not carry what it asked for (a prompt
    # changed during the handshake), so it stays pending past that Connected.
    reconnect_requested_offline: bool = False
    go_away_deadline_us: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    calls: dict[str, CallState] = field(default_factory=dict)
    # The conversation in log order: (role, text) for user/assistant turns and
    # ("tool", call_id) where a call was made; a fresh session is seeded from it.
    conversation: list[tuple[str, str]] = field(default_factory=list)
    anomalies: int = 0
    reconnects: int = 0
    messages: int = 0  # conversation messages logged (user/assistant turns)
    # Set by compaction: ids of calls settled for good (their events are in the log), and
    # whether `conversation` (and with it, every call) is all there.
    archived: set[str] = field(default_factory=set)
    history_complete: bool = True
    # Set by compaction: [handle_ttl_us, crossing_window_us] it kept state for. A worker whose
    # policy looks further back than that must not start from this state (see loading).
    compacted_with: list[int] | None = None

    def knows_call_id(self, call_id: str) -> bool:
        return call_id in self.calls or call_id in self.archived

    def require_history(self) -> None:
        if not self.history_complete:
            raise HistoryNeeded(f"{self.stream_id}: this state was compacted; load the whole "
                                "log for its conversation")

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
        is answered through the id that re-asked for it). The lineage is walked once: `due`
        asks this several times per tool call, over every call of the call (walked per call,
        it cost 1.2 ms per ask with 1,000 calls)."""
        lineage = self.lineage_cutoffs()
        return [c for c in self.calls.values()
                if c.has_outcome and not c.superseded_by and not _held(lineage, c)]

    def unanswered(self) -> list[CallState]:
        """Every call not yet settled (I1: each ends delivered or cancelled)."""
        return [c for c in self.calls.values() if not self.settled(c)]

    def settled(self, call: CallState) -> bool:
        if call.superseded_by:
            return self.settled(self.calls[call.superseded_by])
        return call.status == "cancelled" or (call.has_outcome and self.in_model(call))

    def _lineage(self, gen: int | None = None, cutoff: int | None = None):
        """(generation, cutoff version) pairs whose model state the current session holds
        (or, from `gen`/`cutoff`, a session resumed from a handle of `gen` at `cutoff`)."""
        if gen is None:
            gen, cutoff = self.generation, None
        seen = set()
        while gen and gen not in seen:
            seen.add(gen)
            yield gen, cutoff
            info = self.generations.get(gen)
            if info is None or info.parent is None:
                return
            gen, cutoff = info.parent, info.parent_cutoff

    def lineage_cutoffs(self, handle: Handle | None = None) -> dict[int, int | None]:
        """{generation: cutoff version} whose model state the current session holds (with
        `handle`: a session resumed from it): `_lineage` walked once, for asking about many
        calls (a generation appears once in a lineage)."""
        return dict(self._lineage(handle.generation, handle.version) if handle
                    else self._lineage())

    def in_model(self, call: CallState, handle: Handle | None = None) -> bool:
        """Does the current session's model state hold this call's result (delivery rules)?
        With `handle`: would a session resumed from that handle hold it?"""
        return _held(self.lineage_cutoffs(handle), call)

    def handle_may_hold(self, handle: Handle, send: Send) -> bool:
        """Could the server state saved in `handle` hold `send`? Only if the send was made in
        that state's lineage (the handle's generation up to the handle, its parents up to the
        handles they resumed from) before the cutoff: a send in another lineage never is."""
        return any(send.generation == gen and send.version < cutoff
                   for gen, cutoff in self._lineage(handle.generation, handle.version))

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
        the current session never issued it (it resumed from a state before it, or started
        fresh), and its answer is not in the current model state — or it reached this
        session only as content within `crossing_window_us` of now, so the new request may
        have crossed it on the wire (the model asked before it read the answer). None
        otherwise: an equal call in the session that issued the first is a request of its
        own (two parallel lookups, the user asking twice), and both ids await an answer."""
        for c in self.calls.values():
            if (c.name == name and c.args == args and c.status != "cancelled"
                    and not c.superseded_by and not self.session_knows_call(c)
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
        data["archived"] = sorted(self.archived)
        return data


# ------------------------------------------------------------------------- the fold

def _send_held(lineage: dict[int, int | None], send: Send) -> bool:
    """Does a model state with this lineage (`SessionState.lineage_cutoffs`) hold this send:
    confirmed, made in one of its generations, before that generation's cutoff?"""
    if not send.confirmed or send.generation not in lineage:
        return False
    cutoff = lineage[send.generation]
    return cutoff is None or send.version < cutoff


def _held(lineage: dict[int, int | None], call: CallState) -> bool:
    """Does a model state with this lineage hold the call's result? (A plain loop: `due`
    asks it of every call with an outcome.)"""
    for send in call.sends:
        if _send_held(lineage, send):
            return True
    return False


def times_held(lineage: dict[int, int | None], call: CallState) -> int:
    """How many confirmed sends of `call` a model state with this lineage holds (I2: at most
    one)."""
    return sum(1 for send in call.sends if _send_held(lineage, send))


def _apply(s: SessionState, rec: RecordedEvent) -> None:
    """Apply one event in place (private: callers use evolve/fold, which never mutate)."""
    e = rec.event
    if s.archived and (getattr(e, "call_id", None) in s.archived
                       or getattr(e, "original", None) in s.archived):
        raise HistoryNeeded(f"{rec.stream_id}@{rec.version} ({rec.type}) refers to a call "
                            "this compacted state archived")
    if (not s.history_complete and isinstance(e, ev.Connected)
            and (e.handle is None or e.handle not in s.handles)):
        # A session that does not resume a kept handle lacks the archived results: only the
        # whole history can say what it holds (and seed it).
        raise HistoryNeeded(f"{rec.stream_id}@{rec.version}: a fresh session on a compacted "
                            "state")
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
            if s.reconnect_requested_offline and s.reconnect_pending == "settings":
                s.reconnect_requested_offline = False  # asked during the handshake: still due
            else:
                s.reconnect_pending, s.reconnect_keys = None, []
            s.go_away_deadline_us = None
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
            s.reconnect_requested_offline = s.opened and not s.connected
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
            original = s.calls.get(e.reused_from) if e.reused_from else None
            if original is not None and not original.superseded_by:
                # Answered from the original's recorded result: the model knows that answer
                # by this id now, as after a re-issue (sending it under the original's id
                # too would put one run's result into the session twice).
                call.reissue_of, original.superseded_by = original.call_id, call.call_id
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
            s.messages += 1
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
    _apply_checked(new, event)
    return new


def fold(recorded: Iterable[RecordedEvent], state: SessionState | None = None) -> SessionState:
    """Fold events onto `state` (or the empty state). Does not modify `state`."""
    return fold_into(copy.deepcopy(state) if state is not None else SessionState(), recorded)


def fold_into(state: SessionState, recorded: Iterable[RecordedEvent]) -> SessionState:
    """Fold events into `state` in place: for the one owner of a private working state
    (the service's driver), which would otherwise copy the whole state per event."""
    for rec in recorded:
        if rec.version != state.version + 1:
            raise StreamDamaged(f"fold expected version {state.version + 1}, got {rec.version} "
                                "(gap or reorder in the stream)", stream_id=rec.stream_id,
                                version=state.version + 1)
        _apply_checked(state, rec)
    return state


def _apply_checked(state: SessionState, rec: RecordedEvent) -> None:
    """`_apply`, with a stored event that does not fit the state reported as that event.

    A row can decode and still make no sense here (a deferral of a call that was never
    requested, a payload of the right shape from a damaged log): the fold would die with a
    bare KeyError, or worse go on. Whoever reads the log gets an error naming the event.
    """
    try:
        _apply(state, rec)
    except EventDecodeError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise CorruptEvent(f"does not fit the call's state at this point ({type(exc).__name__}: "
                           f"{exc}), e.g. it names a tool call the log never requested",
                           event_type=rec.type, **rec.where) from exc


# ------------------------------------------------------------------------- snapshots

def to_snapshot(state: SessionState) -> str:
    return json.dumps(state.to_json(), sort_keys=True, separators=(",", ":"))


def from_snapshot(text: str) -> SessionState:
    data = json.loads(text)
    # The JSON has its keys sorted; the dicts must come back in log order, as the fold built
    # them: deferred calls start in request order (I4), and "c10" sorts before "c2".
    calls = [CallState(**{**c, "sends": [Send(**x) for x in c["sends"]]})
             for c in data["calls"].values()]
    data["calls"] = {c.call_id: c for c in sorted(calls, key=lambda c: c.requested_version)}
    data["generations"] = {g.generation: g for g in sorted(
        (Generation(**g) for g in data["generations"].values()), key=lambda g: g.generation)}
    data["handles"] = {h.handle: h for h in sorted(
        (Handle(**h) for h in data["handles"].values()), key=lambda h: h.version)}
    data["conversation"] = [tuple(m) for m in data["conversation"]]
    data["archived"] = set(data["archived"])
    return SessionState(**data)


# ------------------------------------------------------------------------- compaction

def compact(state: SessionState, *, handle_ttl_us: int = HANDLE_TTL_US,
            crossing_window_us: int = CROSSING_WINDOW_US) -> SessionState:
    """The decision state of `state`, bounded: what a snapshot stores (see the module doc).

    Pure; `state` is not modified (the result shares nothing mutable with it once
    serialised: callers serialise it at once). Time is the state's own (its last event), so
    the same state always compacts the same way. Options must be at least the policy's."""
    now = state.last_event_at_us
    # Handles a future session may still resume from (decide.choose_resumption): among the
    # unexpired ones that provably lack every unconfirmed send, only the newest can ever be
    # chosen (a later send is never in an existing handle's state); newer ones are kept too,
    # as they become eligible once their unconfirmed sends are confirmed.
    live = [h for h in state.handles.values() if now - h.issued_at_us <= handle_ttl_us]
    unconfirmed = [s for _c, s in state.unconfirmed_sends()]
    eligible = [h for h in live if not any(state.handle_may_hold(h, s) for s in unconfirmed)]
    floor = max((h.version for h in eligible), default=0)
    handles = {h.handle: h for h in live if h.version >= floor}
    calls = {cid: c for cid, c in state.calls.items()
             if not _settled_for_good(state, c, handles.values(), now, crossing_window_us)}
    # Generations on a lineage a session can still hold (the current one's, every kept
    # handle's), down to the oldest one a kept call was asked or answered in: the lineage
    # walks of decisions only ever look for those (generations grow along a lineage).
    oldest = min([state.generation] + [h.generation for h in handles.values()]
                 + [g for c in calls.values() for g in [c.generation]
                    + [s.generation for s in c.sends]])
    generations: dict[int, Generation] = {}
    for start in [None] + list(handles.values()):
        lineage = state._lineage(start.generation, start.version) if start else state._lineage()
        for gen, _cutoff in lineage:
            if gen < oldest:
                break
            if gen in state.generations:
                generations[gen] = state.generations[gen]
    compacted = copy.copy(state)
    compacted.handles, compacted.generations, compacted.calls = handles, generations, calls
    compacted.archived = state.archived | (state.calls.keys() - calls.keys())
    compacted.conversation, compacted.history_complete = [], False
    kept = [handle_ttl_us, crossing_window_us]
    compacted.compacted_with = (kept if state.compacted_with is None
                                else [min(a, b) for a, b in zip(kept, state.compacted_with)])
    compacted.settings, compacted.tools = dict(state.settings), list(state.tools)
    compacted.reconnect_keys = list(state.reconnect_keys)
    return compacted


def _settled_for_good(state: SessionState, c: CallState, handles, now: int,
                      crossing_window_us: int) -> bool:
    """No decision can involve `c` again: it is cancelled or its outcome is in the model of
    the current session and of every session a kept handle could resume (any later session
    descends from one of those, or is fresh and loads the whole history), every send of it
    is confirmed, it is past the crossing window, and no re-issue links it to another call."""
    if c.reissue_of or c.superseded_by or any(not s.confirmed for s in c.sends):
        return False
    last = max([c.requested_at_us, c.finished_at_us or 0] + [s.at_us for s in c.sends])
    if now - last <= crossing_window_us:
        return False
    if c.status == "cancelled":
        return True
    return (c.has_outcome and state.in_model(c)
            and all(state.in_model(c, h) for h in handles))
