"""Replay a call's log through today's decide/due code and report where it decides otherwise.

The log holds two kinds of facts. **Decisions** are what `decide(state, observation)` wrote
when the shell observed something. Since `decision.observed`, each is logged as the
observation itself followed by the events decided on it (observed.py), and replay decides
again on exactly that observation, whatever its kind. An older log has no such event:
each group of events appended together (one timestamp) is read back as the observation it
records (observations.py), which covers only these kinds:

    ToolCallRequested [+ ToolCallDeferred | ToolCallReissued | reused ToolCallCompleted
    | refusal anomaly + ToolCallFailed], tool-call anomalies
                                                   -> ToolCallsArrived
    a rejected server message's anomaly [+ ReconnectRequested] -> ServerMessageRejected
    BotStartedSpeaking / BotStoppedSpeaking / Interrupted -> SpeechStarted / SpeechStopped / …
    SettingsChanged [+ ReconnectRequested("settings")]    -> SettingsUpdate
    InteractionStatus                                     -> InteractionStatusObserved
    GoAwayReceived                                        -> GoAway
    ToolCallCancelled("server"), cancellation anomalies   -> CancellationArrived

Replay runs today's `decide` on the state before the group and compares its events with the
logged ones. **Effects** are what the shell did because `due(state)` said so: a call started,
an in-doubt call resolved, a result or an intermediate result sent, a contextUpdate, turns
told to a resumed session, a reconnect (a failed send's included), a new session (none after
the connection was given up), the handle it resumed from.
For each, replay asks today's `due` / `choose_resumption` at that point (same state, the
event's time) whether it would have done the same. The state always follows the *logged*
events, so one divergence does not cascade into a hundred.

An anomaly's details are diagnostics, not decisions: anomalies compare by kind. Arguments the
log does not keep (over Policy.max_args_bytes, or not storable) are replaced by ones that
lead to the same refusal, and compare as absent.
"""

from __future__ import annotations

from typing import Any

from ... import events as ev
from ...cut_notes import CUT_TURN
from ...decide import RESYNC_KINDS, Observation, decide
from ...delivery import (SEND_FAILED, ApplyContext, Reconnect, ResolveInDoubt, SendConversation,
                         SendResult, StartCall, TellCut, choose_resumption, due,
                         lacks_context)
from ...policy import Policy
from ...errors import EventDecodeError
from ...events import canonical_json
from ...lineage import in_model
from ...projection import fold_into
from ...observed import Unreplayable, observation_of
from ...records import RecordedEvent
from ...state import SessionState
from ...storable import storable_events
from .observations import group_at
from .report import Divergence, ReplayReport, effect_json, event_json, observation_json

def _same(a: list[ev.Event], b: list[ev.Event], args_not_logged: frozenset = frozenset()
          ) -> bool:
    return canonical_json([_comparable(x, args_not_logged) for x in a]) == canonical_json(
        [_comparable(x, args_not_logged) for x in b])


def _comparable(e: ev.Event, args_not_logged: frozenset) -> dict[str, Any]:
    if isinstance(e, ev.AnomalyRecorded):
        return {"type": e.TYPE, "kind": e.kind, "generation": e.generation}
    if isinstance(e, ev.ToolCallRequested) and e.call_id in args_not_logged:
        return {"type": e.TYPE, "data": {**e.to_data(), "args": None}}
    return event_json(e)


class _Replayer:
    def __init__(self, records: list[RecordedEvent], policy: Policy, call_id: str):
        self.recs, self.policy = records, policy
        self.report = ReplayReport(call_id or (records[0].stream_id if records else ""))
        self.state = SessionState(stream_id=self.report.call_id)
        self.failed_handshake = False
        # Handles the worker passed over after a failed handshake (its memory, so a takeover
        # forgets them): today's choice of handle is made without them, as the shell's was.
        self.passed_over: set[str] = set()
        self._args_not_logged: set[str] = set()

    # ------------------------------------------------------------------ state
    def advance(self, recs: list[RecordedEvent]) -> None:
        fold_into(self.state, recs)  # in place: replay folds once, not once per event

    # ------------------------------------------------------------------ checks
    def diverge(self, first: int, last: int, kind: str, message: str, obs, logged, decided):
        self.report.divergences.append(Divergence(
            first, last, kind, message, observation_json(obs) if obs is not None else None,
            logged, decided))

    def check_decision(self, i: int, obs: Observation, n: int) -> None:
        """A decision of an older log, reconstructed from the group of records at i."""
        grecs = self.recs[i:i + n]
        self.report.reconstructed += 1
        self.compare(grecs, obs, decide(self.state, obs, self.policy))

    def check_logged(self, i: int, record: ev.ObservationRecorded) -> int:
        """The decision logged at i (its observation, then its events); how many records."""
        n = 1 + record.events
        grecs = self.recs[i + 1:i + n]
        if len(grecs) < record.events:
            raise ValueError(f"the decision at version {self.recs[i].version} names "
                             f"{record.events} events; the log ends after {len(grecs)}")
        self.report.decisions_logged += 1
        try:
            obs, not_logged = observation_of(record, [r.event for r in grecs])
        except Unreplayable:
            kinds = self.report.not_replayed
            kinds[record.kind] = kinds.get(record.kind, 0) + 1
            self.advance(self.recs[i:i + n])
            return n
        self._args_not_logged |= not_logged
        at = self.recs[i].recorded_at_us
        self.compare(grecs, obs, storable_events(
            decide(self.state, obs, self.policy, at), self.state.generation))
        self.advance(self.recs[i:i + 1])
        for rec in grecs:
            # What the decision says the shell did (a session it opened or left) is also
            # checked against what due / choose_resumption would have it do.
            if isinstance(rec.event, (ev.Connected, ev.Disconnected)):
                self.check_effect(rec)
            self.advance([rec])
        return n

    def compare(self, grecs: list[RecordedEvent], obs: Observation,
                decided: list[ev.Event]) -> None:
        logged = [r.event for r in grecs]
        self.report.decisions_checked += 1
        if not _same(logged, decided, frozenset(self._args_not_logged)):
            self.diverge(grecs[0].version, grecs[-1].version, "decide",
                         _explain(self.state, logged, decided), obs,
                         [event_json(x) for x in logged], [event_json(x) for x in decided])

    def check_effect(self, rec: RecordedEvent) -> None:  # noqa: C901 - one case per effect
        e, s, t = rec.event, self.state, rec.recorded_at_us
        match e:
            case ev.ToolCallStarted():
                effects = due(s, self.policy, t)
                mine = [x for x in effects if getattr(x, "call_id", None) == e.call_id]
                start = next((x for x in mine if isinstance(x, StartCall)), None)
                call = s.calls.get(e.call_id)
                if start is None:
                    why = _why_not_start(s, call, mine, self.policy)
                    self.effect_diverges(rec, f"the log starts {e.call_id} (attempt {e.attempt})"
                                         f" but today's code would not: {why}", effects)
                elif (start.attempt, start.idempotency_key) != (e.attempt, e.idempotency_key):
                    self.effect_diverges(rec, f"{e.call_id} started as attempt {e.attempt} key "
                                         f"{e.idempotency_key!r}; today's code: attempt "
                                         f"{start.attempt} key {start.idempotency_key!r}", effects)
                elif call is not None and call.status in ("requested", "deferred"):
                    fresh = [x for x in effects if isinstance(x, StartCall)
                             and s.calls[x.call_id].status in ("requested", "deferred")]
                    if fresh and fresh[0].call_id != e.call_id:
                        self.effect_diverges(rec, f"{e.call_id} started before "
                                             f"{fresh[0].call_id}, which was requested first "
                                             "(calls start in request order)", effects)
            case ev.ToolCallFailed(outcome_unknown=True):
                effects = due(s, self.policy, t)
                if ResolveInDoubt(e.call_id) not in effects:
                    mine = [x for x in effects if getattr(x, "call_id", None) == e.call_id]
                    what = ("re-run it (idempotent tool)" if mine else "not resolve it now")
                    self.effect_diverges(rec, f"the log gives up on in-doubt call {e.call_id} "
                                         f"(outcome unknown); today's code would {what}", effects)
            case ev.ToolResultSending() | ev.ToolResultSent():
                call = s.calls.get(e.call_id)
                if isinstance(e, ev.ToolResultSent) and call is not None and any(
                        not x.confirmed and x.generation == e.generation
                        for x in _sends_of(call, e.part)):
                    return  # the confirmation of a send already checked
                if e.via == "seed":
                    self.check_seed(rec, e, call)
                    return
                effects = due(s, self.policy, t)
                send = next((x for x in effects if isinstance(x, SendResult)
                             and x.call_id == e.call_id and x.part == e.part), None)
                if send is None:
                    why = ("its result is already in the model's state: this is a duplicate"
                           if call is not None and in_model(s, call) else
                           "it has no outcome yet" if call is None or not call.has_outcome else
                           "no live session" if not s.connected else "nothing to send")
                    what = f"{e.call_id}" + (f" (intermediate result {e.part})" if e.part else "")
                    self.effect_diverges(rec, f"the log sends {what} via {e.via} on "
                                         f"generation {e.generation}; today's code would not "
                                         f"send it: {why}", effects)
                elif send.via != e.via or e.generation != s.generation:
                    self.effect_diverges(rec, f"the log sends {e.call_id} via {e.via} on "
                                         f"generation {e.generation}; today's code: via "
                                         f"{send.via} on generation {s.generation}", effects)
            case ev.ContextSending():
                effects = due(s, self.policy, t)
                if ApplyContext(e.version) not in effects:
                    why = ("the model does not take a contextUpdate" if not s.rules.context_update
                           else "the session already holds those settings"
                           if not lacks_context(s) else
                           f"it would send the settings as of version {s.context_version}")
                    self.effect_diverges(rec, f"the log sends a contextUpdate (settings as of "
                                         f"version {e.version}) on generation {e.generation}; "
                                         f"today's code would not: {why}", effects)
            case ev.ConversationSending(via="seed"):
                self.report.effects_checked += 1
                info = s.generations.get(s.generation)
                if e.generation != s.generation or info is None or info.handle:
                    self.diverge(rec.version, rec.version, "due", f"the log seeds the "
                                 f"conversation into generation {e.generation}; today's code "
                                 "seeds only the current, fresh session", None,
                                 [event_json(e)], [])
                return
            case ev.ConversationSending():
                effects = due(s, self.policy, t)
                if SendConversation(e.through) not in effects:
                    self.effect_diverges(rec, f"the log tells generation {e.generation} the "
                                         f"turns up to version {e.through} as content; today's "
                                         "code would not", effects)
            case ev.CutTelling() | ev.CutUntold():
                effects = due(s, self.policy, t)
                via = e.via if isinstance(e, ev.CutTelling) else "none"
                if not any(isinstance(x, TellCut) and (x.cut, x.via) == (e.cut, via)
                           for x in effects):
                    told = ("tells" if via != "none" else "decides not to tell")
                    self.effect_diverges(rec, f"the log {told} generation {e.generation} "
                                         f"about the cut at version {e.cut} (via {via}); "
                                         "today's code would not", effects)
            case ev.Disconnected(reason=reason) if reason in ("settings", "go_away", CUT_TURN,
                                                               SEND_FAILED, *RESYNC_KINDS):
                effects = due(s, self.policy, t)
                # A failed send's reconnect is its own (due at once, whatever the turn).
                if not any(isinstance(x, Reconnect) and (reason != SEND_FAILED
                                                         or x.reason == SEND_FAILED)
                           for x in effects):
                    why = ("no send on it failed" if reason == SEND_FAILED else
                           "the bot is still speaking" if s.bot_speaking else
                           "the model is still working (interaction status IN_PROGRESS)"
                           if not s.idle else
                           "tool calls are still waiting to start" if any(
                               c.status in ("requested", "deferred") for c in s.calls.values())
                           else "no reconnect is pending")
                    self.effect_diverges(rec, f"the log reconnects ({e.reason}) on generation "
                                         f"{e.generation}; today's code would wait: {why}",
                                         effects)
            case ev.Disconnected(reason="handshake_failed"):
                self.failed_handshake = True
                return
            case ev.AnomalyRecorded(kind="handshake_failed"):
                d = e.detail if isinstance(e.detail, dict) else {}
                # Before `passed_over` was logged, every failure passed its handle over. (Since
                # connection.handle_refused, the fold marks the handle too, for every worker:
                # the anomaly says it for the older logs, whose workers forgot at takeover.)
                if isinstance(d.get("handle"), str) and d.get("passed_over", True):
                    self.passed_over.add(d["handle"])
                return
            case ev.WorkerAttached():
                self.passed_over.clear()
                return
            case ev.Connected():
                fallback, self.failed_handshake = self.failed_handshake, False
                if not s.connected and not any(isinstance(x, Reconnect)
                                               for x in due(s, self.policy, t)):
                    # A session opened where none was due: after the connection was given
                    # up (a retry after the failed handshake that gave it up, say).
                    self.report.effects_checked += 1
                    why = ("the call is closed" if s.closed else
                           "the connection was given up" if s.given_up else
                           "no reconnect is due")
                    self.diverge(rec.version, rec.version, "due", f"the log opens generation "
                                 f"{e.generation}; today's code would not connect: {why}",
                                 None, [event_json(e)], [])
                    return
                if fallback:
                    return  # a retry after a refused resumption: the shell's call, not due's
                want = choose_resumption(s, self.policy, t, frozenset(self.passed_over))
                self.report.effects_checked += 1
                if want != e.handle:
                    self.diverge(rec.version, rec.version, "resumption",
                                 f"generation {e.generation} "
                                 + (f"resumed from handle {e.handle!r}" if e.handle else
                                    "started fresh") + "; today's code would "
                                 + (f"resume from handle {want!r}" if want else "start fresh"),
                                 None, [event_json(e)], [{"resume_from": want}])
                return
            case _:
                return
        self.report.effects_checked += 1

    def check_seed(self, rec: RecordedEvent, e, call) -> None:
        """A result put into a fresh session's seeded history (part of the reconnect, not a
        `due` send): only on the current, fresh generation, and only a call's outcome or, for
        a call still running, its intermediate results, which is what `seed_plan` includes."""
        s = self.state
        self.report.effects_checked += 1
        info = s.generations.get(s.generation)
        why = ("no such call" if call is None else
               f"it has no intermediate result {e.part}" if e.part > len(call.progress) else
               f"it has an outcome: only that is seeded" if e.part and call.has_outcome else
               f"it has no outcome yet (status {call.status})"
               if not e.part and not call.has_outcome else
               f"generation {e.generation} is not the current one ({s.generation})"
               if e.generation != s.generation else
               "the current session resumed from a handle: only a fresh session is seeded"
               if info is not None and info.handle else None)
        if why is not None:
            self.diverge(rec.version, rec.version, "due", f"the log seeds {e.call_id} into "
                         f"generation {e.generation}; today's code would not: {why}", None,
                         [event_json(e)], [])

    def effect_diverges(self, rec: RecordedEvent, message: str, effects: list) -> None:
        self.diverge(rec.version, rec.version, "due", message, None, [event_json(rec.event)],
                     [effect_json(x) for x in effects])

    # ------------------------------------------------------------------ run
    def run(self) -> ReplayReport:
        i = 0
        logged = False  # the log records its observations (from the first one on)
        try:
            while i < len(self.recs):
                if self.recs[i].type == ev.ObservationRecorded.TYPE:
                    logged = True
                    record = self.recs[i].event
                    assert isinstance(record, ev.ObservationRecorded)
                    i += self.check_logged(i, record)
                    continue
                found = None if logged else group_at(self.recs, i, self.state.generation)
                if found is not None:
                    obs, n = found.observation, found.length
                    self._args_not_logged |= found.args_not_logged
                    self.check_decision(i, obs, n)
                else:
                    n = 1
                    self.check_effect(self.recs[i])
                self.advance(self.recs[i:i + n])
                i += n
        except (EventDecodeError, ValueError, KeyError) as exc:
            at = self.recs[i].version if i < len(self.recs) else "?"
            self.report.error = f"cannot replay past version {at}: {exc}"
        self.report.events = self.state.version
        return self.report


def _sends_of(call, part: int) -> list:
    return call.sends if part == 0 or part > len(call.progress) else call.progress[part - 1].sends


def _why_not_start(s: SessionState, call, mine: list, policy: Policy) -> str:
    if call is None:
        return "no such call was requested"
    if any(isinstance(x, ResolveInDoubt) for x in mine):
        return "it is in doubt and the tool is not idempotent: answer 'outcome unknown' instead"
    if call.status == "deferred" and s.bot_speaking:
        return "it is deferred and the bot is still speaking"
    if call.status == "requested" and s.bot_speaking and policy.defers(call.name, call.mode):
        return "the bot is speaking and the tool is deferrable"
    if call.status in ("completed", "failed", "cancelled"):
        return f"it is already {call.status}"
    if call.status == "started":
        return "it is already running"
    return f"its status is {call.status}"


def _explain(s: SessionState, logged: list[ev.Event], decided: list[ev.Event]) -> str:
    lt = {(x.TYPE, getattr(x, "call_id", None)) for x in logged}
    dt = {(x.TYPE, getattr(x, "call_id", None)) for x in decided}
    parts = []
    for etype, cid in sorted(dt - lt, key=str):
        what = f"{etype}" + (f" for {cid}" if cid else "")
        if etype == "tool.call_deferred":
            what += " (the bot was speaking)"
        parts.append(f"today's code adds {what}")
    for etype, cid in sorted(lt - dt, key=str):
        what = f"{etype}" + (f" for {cid}" if cid else "")
        if etype == "tool.call_deferred" and not s.bot_speaking:
            what += " (the bot was not speaking)"
        parts.append(f"the log has {what}, today's code does not")
    return "; ".join(parts) or "same events, different contents"


def replay(records: list[RecordedEvent], policy: Policy | None = None, *,
           call_id: str = "") -> ReplayReport:
    """Compare a call's logged decisions and effects with what today's code decides."""
    return _Replayer(list(records), policy or Policy(), call_id).run()
