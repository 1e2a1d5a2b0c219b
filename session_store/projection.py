"""The projection: a call's state as the fold of its events (pure; no I/O).

`evolve(state, event)` returns a new state (state.py); `fold(events)` folds many. Snapshots
are a cache of this fold (`to_snapshot` / `from_snapshot`) holding the compacted state
(compaction.py): `PROJECTION_VERSION` changes whenever the fold changes meaning, and a
snapshot from another version is ignored, so it never changes an answer.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable

from . import events as ev
from .errors import CorruptEvent, EventDecodeError, StreamDamaged
from .lineage import context_held
from .records import RecordedEvent, recorded_at_problem
from .state import (CONTEXT_KEYS, CallState, Cover, CutNote, Generation, Handle, HistoryNeeded,
                    Playing, Progress, Send, SessionState, Withholding)
from .withholding import after

PROJECTION_VERSION = 16


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
        case ev.SessionOpened() if s.opened:
            # A call opens once: a second one would reset its model, tools and epoch.
            raise CorruptEvent("a second session.opened: the call was opened already",
                               event_type=rec.type, **rec.where)
        case ev.SessionOpened():
            s.opened, s.model, s.tools = True, e.model, list(e.tools)
            s.worker, s.epoch, s.settings = e.worker, e.epoch, dict(e.settings)
        case ev.WorkerAttached():
            s.worker, s.epoch = e.worker, max(s.epoch, e.epoch)
            s.takeovers += 1
            # A new worker tries again, within the run of failures it inherits (not a new one).
            s.given_up = False
            # The old worker's live session and speech died with it.
            s.connected, s.bot_speaking = False, False
            s.cut_notes = []  # owed to the session that died: the next one is seeded
            s.uncut_answer = None
        case ev.SessionClosed():
            s.closed, s.connected, s.bot_speaking = True, False, False
            s.playing = None
            s.cut_notes = []
        case ev.Connected():
            parent = s.handles.get(e.handle) if e.handle else None
            # A fresh setup carries the settings as they are now; a resumed state keeps its
            # handle's (CONTEXT_KEYS).
            base = context_held(s, parent) if parent else s.context_version
            s.generations[e.generation] = Generation(
                e.generation, rec.version, e.handle,
                parent.generation if parent else None, parent.version if parent else None,
                base)
            if s.generation:
                s.reconnects += 1
            s.generation, s.connected = e.generation, True
            s.cut_notes = []  # a note is owed only to the session that said the turn
            s.interaction_idle = True
            if s.reconnect_requested_offline and s.reconnect_pending == "settings":
                s.reconnect_requested_offline = False  # asked during the handshake: still due
            else:
                s.reconnect_pending, s.reconnect_keys = None, []
            s.go_away_deadline_us = None
            s.bot_speaking = False
            s.handshake_failures.clear()  # a handshake went through: no longer in a row
            s.given_up = False
        case ev.Disconnected():
            if e.generation == s.generation:
                s.connected, s.bot_speaking = False, False
                s.interaction_idle = True
                s.cut_notes = []
            # Only a session that got a server message ends a run of failures (pipecat's rule:
            # setupComplete alone is no progress); its own error, if any, starts the next run.
            if e.heard:
                s.failures_in_row, s.failing_since_us = 0, None
            if e.reason == "error":
                _failed(s, rec.recorded_at_us)
        case ev.InteractionStatus():
            if e.generation == s.generation:
                s.interaction_idle = e.status != "IN_PROGRESS"
        case ev.HandleIssued():
            s.handles[e.handle] = Handle(e.handle, e.generation, rec.version, rec.recorded_at_us,
                                         e.last_consumed_client_message_index)
            s.newest_handle = e.handle
        case ev.HoldsAll():
            s.withholding = after(s.withholding, e)
            _seeded(s, e.generation)
        case ev.SendUnread() | ev.EarlierTurnEnded() | ev.ModelReacted():
            s.withholding = after(s.withholding, e)
        case ev.HandleRefused():
            if e.handle in s.handles:
                s.handles[e.handle].refused = True
        case ev.GoAwayReceived():
            s.go_away_deadline_us = rec.recorded_at_us + int(e.time_left_s * 1e6)
            s.reconnect_pending = s.reconnect_pending or "go_away"
        case ev.ReconnectRequested():
            s.reconnect_pending = e.reason
            s.reconnect_requested_offline = s.opened and not s.connected
            s.reconnect_keys = sorted(set(s.reconnect_keys) | set(e.keys))
        case ev.BotStartedSpeaking():
            s.bot_speaking = True
        case ev.BotStoppedSpeaking():
            s.bot_speaking = False
            if e.source != "turn_complete":  # (the model's turn ended; its audio plays on)
                s.playing = None
        case ev.Interrupted():
            s.bot_speaking, s.uncut_answer, s.playing = False, None, None
        case ev.SettingsChanged():
            s.settings.update(e.values)
            if CONTEXT_KEYS & set(e.keys):
                s.context_version = rec.version
        case ev.ContextSending():
            s.context_sends.append(Cover(e.generation, "context_update", rec.version, e.version))
        case ev.ContextSent():
            _confirm_cover(s.context_sends, e.generation, e.version, "context_update", rec)
        case ev.ConversationSending():
            s.conversation_sends.append(Cover(e.generation, e.via, rec.version, e.through))
            if e.via == "seed":
                _seeded(s, e.generation)
        case ev.ConversationSent():
            _confirm_cover(s.conversation_sends, e.generation, e.through, e.via, rec)
        case ev.ToolCallRequested():
            s.calls[e.call_id] = CallState(e.call_id, e.name, dict(e.args), e.generation,
                                           rec.version, rec.recorded_at_us, mode=e.mode)
            s.conversation.append(("tool", e.call_id))
        case ev.ToolCallProgress():
            call = s.calls[e.call_id]
            if e.part != len(call.progress) + 1:
                raise ValueError(f"intermediate result {e.part} of {e.call_id} after "
                                 f"{len(call.progress)}")
            call.progress.append(Progress(e.part, e.result, e.scheduling, rec.recorded_at_us))
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
            call.status, call.attempt, call.checked = "started", e.attempt, None
            call.idempotency_key, call.started_epoch = e.idempotency_key, e.epoch
            call.started_at_us = rec.recorded_at_us
        case ev.ToolCallCompleted():
            call = s.calls[e.call_id]
            if call.status != "cancelled":
                call.status, call.result, call.reused_from = "completed", e.result, e.reused_from
                call.scheduling = e.scheduling
            call.finished_at_us = rec.recorded_at_us
            call.finished_after_end = s.closed
            reused = s.calls.get(e.reused_from) if e.reused_from else None
            if reused is not None and not reused.superseded_by:
                # Answered from the original's recorded result: the model knows that answer
                # by this id now, as after a re-issue (sending it under the original's id
                # too would put one run's result into the session twice).
                call.reissue_of, reused.superseded_by = reused.call_id, call.call_id
            _inherit_outcome(s, call)
        case ev.ToolCallFailed():
            call = s.calls[e.call_id]
            if call.status != "cancelled":
                call.status, call.error = "failed", e.error
                call.outcome_unknown = e.outcome_unknown
            call.finished_at_us = rec.recorded_at_us
            call.finished_after_end = s.closed
            _inherit_outcome(s, call)
        case ev.ToolCallCancelled():
            call = s.calls[e.call_id]
            call.status, call.cancel_reason = "cancelled", e.reason
        case ev.ToolOutcomeChecked():
            s.calls[e.call_id].checked = e.answer
        case ev.ToolResultSending():
            s.calls[e.call_id].sends_of(e.part).append(Send(e.generation, e.via, rec.version))
        case ev.ToolResultSent():
            sends = s.calls[e.call_id].sends_of(e.part)
            for send in reversed(sends):
                if send.generation == e.generation and not send.confirmed:
                    send.confirmed, send.at_us = True, rec.recorded_at_us
                    break
            else:  # a confirmation without its intent (older logs): the send itself
                sends.append(Send(e.generation, e.via, rec.version, confirmed=True,
                                  at_us=rec.recorded_at_us))
        case ev.ConversationMessage():
            _add_message(s, e, rec.version)
            if e.role == "assistant":
                s.playing = None if not e.audio_s else Playing(
                    e.text, e.generation, e.audio_from_us or rec.recorded_at_us, e.audio_s)
        case ev.ConversationMessageCut():
            _cut_last_answer(s, e.text, e.generation)
            s.uncut_answer, s.playing = None, None
            if s.connected and e.generation == s.generation:
                s.cut_notes.append(CutNote(rec.version, e.generation, e.text))
        case ev.CutTelling():
            for note in s.cut_notes:
                if note.cut == e.cut:
                    note.via = e.via
        case ev.CutTold() | ev.CutUntold():
            s.cut_notes = [n for n in s.cut_notes if n.cut != e.cut]
        case ev.AnomalyRecorded():
            s.anomalies += 1
            # A failed handshake is logged as this anomaly (decide.HandshakeFailed): its
            # handle's failures in a row decide when it is passed over.
            handle = e.detail.get("handle") if isinstance(e.detail, dict) else None
            if e.kind == "handshake_failed" and isinstance(handle, str) and handle:
                s.handshake_failures[handle] = s.handshake_failures.get(handle, 0) + 1
            if e.kind == "handshake_failed":
                _failed(s, rec.recorded_at_us)
            elif e.kind == "connection_given_up":  # decided, or (older logs) the shell's
                s.given_up = True


def _seeded(s: SessionState, generation: int) -> None:
    info = s.generations.get(generation)
    if info is not None:
        info.seeded = True


def _failed(s: SessionState, at_us: int) -> None:
    """One more connection failure in a row, recorded at `at_us`."""
    s.failures_in_row += 1
    if s.failing_since_us is None:
        s.failing_since_us = at_us


def _cut_last_answer(s: SessionState, text: str, generation: int) -> None:
    """The bot's last message becomes what the caller heard of it. A compacted state holds
    no turns: seeding reads them from the log, where the cut follows the message."""
    said = [i for i, (role, _t) in enumerate(s.conversation) if role == "assistant"]
    if said:
        s.conversation[said[-1]] = ("assistant", text)
        at = sum(1 for role, _t in s.conversation[:said[-1]] if role != "tool")
        before = s.message_marks[at - 1][0] if at > 0 else 0
        s.cut_turns.append((before, generation))


def _add_message(s: SessionState, e: ev.ConversationMessage, version: int) -> None:
    """A turn, in log order; late user words go just before the bot's message that
    answered them, marked as heard when that message was (a model state holding the answer
    heard the question: telling it again would leave it dangling after its answer)."""
    mark, at, mark_at = (version, e.generation), len(s.conversation), len(s.message_marks)
    if e.late and e.role == "user" and s.answer_mark is not None:
        mark = (s.answer_mark[0], e.generation)
        if s.history_complete:  # (a compacted state keeps neither the turns nor their order)
            at = max(i for i, (role, _t) in enumerate(s.conversation) if role == "assistant")
            mark_at = sum(1 for role, _t in s.conversation[:at] if role != "tool")
    s.conversation.insert(at, (e.role, e.text))
    s.message_marks.insert(mark_at, mark)
    s.messages += 1
    if e.role == "assistant":
        s.answer_mark, s.uncut_answer = mark, (e.text, e.generation)


def _confirm_cover(covers: list[Cover], generation: int, through: int, via: str,
                   rec: RecordedEvent) -> None:
    for cover in reversed(covers):
        if cover.generation == generation and cover.through == through and not cover.confirmed:
            cover.confirmed = True
            return
    covers.append(Cover(generation, via, rec.version, through, confirmed=True))


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
    wrong = recorded_at_problem(rec.recorded_at_us)
    if wrong:  # (every output shows the time: none could)
        raise CorruptEvent(wrong, event_type=rec.type, **rec.where)
    try:
        _apply(state, rec)
    except EventDecodeError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError, ArithmeticError) as exc:
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
    calls = [CallState(**{**c, "sends": [Send(**x) for x in c["sends"]],
                          "progress": [Progress(**{**p, "sends": [Send(**x) for x in p["sends"]]})
                                       for p in c["progress"]]})
             for c in data["calls"].values()]
    data["calls"] = {c.call_id: c for c in sorted(calls, key=lambda c: c.requested_version)}
    data["generations"] = {g.generation: g for g in sorted(
        (Generation(**g) for g in data["generations"].values()), key=lambda g: g.generation)}
    data["handles"] = {h.handle: h for h in sorted(
        (Handle(**h) for h in data["handles"].values()), key=lambda h: h.version)}
    data["conversation"] = [tuple(m) for m in data["conversation"]]
    data["message_marks"] = [tuple(m) for m in data["message_marks"]]
    data["cut_turns"] = [tuple(m) for m in data.get("cut_turns", [])]
    data["cut_notes"] = [CutNote(**n) for n in data.get("cut_notes", [])]
    data["answer_mark"] = tuple(data["answer_mark"]) if data.get("answer_mark") else None
    data["uncut_answer"] = tuple(data["uncut_answer"]) if data.get("uncut_answer") else None
    data["playing"] = Playing(**data["playing"]) if data.get("playing") else None
    data["context_sends"] = [Cover(**c) for c in data["context_sends"]]
    data["conversation_sends"] = [Cover(**c) for c in data["conversation_sends"]]
    data["archived"] = set(data["archived"])
    data["withholding"] = Withholding(**data["withholding"])
    return SessionState(**data)
