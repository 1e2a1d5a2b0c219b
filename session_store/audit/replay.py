"""Replay a call's log through today's decide/due code and report where it decides otherwise.

The log holds two kinds of facts. **Decisions** are what `decide(state, observation)` wrote
when the shell observed something; each such group of events (appended together, so they
share one timestamp) lets us rebuild the observation:

    ToolCallRequested [+ ToolCallDeferred | ToolCallReissued | reused ToolCallCompleted
    | refusal anomaly + ToolCallFailed], tool-call anomalies
                                                   -> ToolCallsArrived
    a rejected server message's anomaly [+ ReconnectRequested] -> ServerMessageRejected
    BotStartedSpeaking / BotStoppedSpeaking / Interrupted -> SpeechStarted / SpeechStopped / …
    SettingsChanged [+ ReconnectRequested("settings")]    -> SettingsUpdate
    GoAwayReceived                                        -> GoAway
    ToolCallCancelled("server"), cancellation anomalies   -> CancellationArrived

Replay runs today's `decide` on the state before the group and compares its events with the
logged ones. **Effects** are what the shell did because `due(state)` said so: a call started,
an in-doubt call resolved, a result sent, a reconnect, the handle a new session resumed from.
For each, replay asks today's `due` / `choose_resumption` at that point (same state, the
event's time) whether it would have done the same. The state always follows the *logged*
events, so one divergence does not cascade into a hundred.

An anomaly's details are diagnostics, not decisions: anomalies compare by kind. Arguments the
log does not keep (over Policy.max_args_bytes, or not storable) are replaced by ones that
lead to the same refusal, and compare as absent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .. import events as ev
from ..decide import (RESYNC_KINDS, CancellationArrived, FunctionCall, GoAway,
                      InterruptionObserved, Observation, Policy, Reconnect, ResolveInDoubt,
                      SendResult, ServerMessageRejected, SettingsUpdate, SpeechStarted,
                      SpeechStopped, StartCall, ToolCallsArrived, choose_resumption, decide, due)
from ..errors import EventDecodeError
from ..events import canonical_json
from ..projection import SessionState, fold_into
from ..records import RecordedEvent
from .redaction import Redactor

TOOL_CALL_ANOMALIES = ("tool_call_without_name", "tool_call_without_id", "duplicate_tool_call_id")
#: Anomalies that qualify a call requested in the same group (decide refused to run it).
CALL_REFUSALS = ("tool_call_without_name", "unknown_tool", "tool_args_too_large",
                 "invalid_tool_args")
#: Anomalies decided on a ServerMessageRejected observation.
MESSAGE_ANOMALIES = tuple(RESYNC_KINDS) + ("unknown_message", "message_too_big")


@dataclass
class Divergence:
    version: int
    to_version: int
    kind: str  # decide | due | resumption
    message: str
    observation: dict[str, Any] | None
    logged: list[dict[str, Any]]
    decided: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def redacted(self, redactor: Redactor) -> "Divergence":
        """A copy fit to show: the observation and the events redacted as the log's events
        are (they carry the same arguments and results), the message scrubbed, and a
        handle it quotes fingerprinted as the events' handles are."""
        items = self.logged + self.decided
        handles = {h for x in items
                   for h in (x.get("resume_from"), x.get("data", {}).get("handle"))
                   if isinstance(h, str) and h}
        message = redactor.scrub_text(self.message)
        for h in handles:
            message = message.replace(repr(h), repr(redactor.fingerprint(h)))
        return dataclasses.replace(
            self, message=message,
            observation=(redactor.redact_observation(self.observation)
                         if self.observation is not None else None),
            logged=[redactor.redact_replay_item(x) for x in self.logged],
            decided=[redactor.redact_replay_item(x) for x in self.decided])


@dataclass
class ReplayReport:
    call_id: str
    events: int = 0
    decisions_checked: int = 0
    effects_checked: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    error: str | None = None  # the log could not be read to the end

    @property
    def ok(self) -> bool:
        return not self.divergences and self.error is None

    def redacted(self, redactor: Redactor) -> "ReplayReport":
        """A copy fit to show (see Divergence.redacted); the error may quote a stored value."""
        return dataclasses.replace(
            self, divergences=[d.redacted(redactor) for d in self.divergences],
            error=redactor.scrub_text(self.error) if self.error is not None else None)

    def to_json(self) -> dict[str, Any]:
        return {"call": self.call_id, "ok": self.ok, "events": self.events,
                "decisions_checked": self.decisions_checked,
                "effects_checked": self.effects_checked, "error": self.error,
                "divergences": [d.to_json() for d in self.divergences]}


def parse_policy(defer: str = "all", idempotent: str = "", reuse: str = "all",
                 go_away_margin_s: float | None = None) -> Policy:
    """A Policy from CLI-style strings: "all" | "none" | comma-separated tool names."""

    def names(text: str):
        text = (text or "").strip()
        if text in ("all", "none"):
            return text
        return frozenset(n.strip() for n in text.split(",") if n.strip())

    kwargs: dict[str, Any] = {"defer": names(defer), "reuse_equivalent": names(reuse)}
    idem = names(idempotent)
    kwargs["idempotent"] = frozenset() if isinstance(idem, str) else idem
    if go_away_margin_s is not None:
        kwargs["go_away_margin_s"] = go_away_margin_s
    return Policy(**kwargs)


def event_json(e: ev.Event) -> dict[str, Any]:
    return {"type": e.TYPE, "data": e.to_data()}


def effect_json(effect: Any) -> dict[str, Any]:
    return {"effect": type(effect).__name__, **dataclasses.asdict(effect)}


def observation_json(obs: Observation) -> dict[str, Any]:
    return {"observation": type(obs).__name__, **dataclasses.asdict(obs)}


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

    # ------------------------------------------------------------------ grouping
    def group(self, i: int) -> tuple[Observation, int] | None:
        """The observation a decision group starting at i records, and the group's length."""
        recs, rec = self.recs, self.recs[i]
        e = rec.event
        same_time = lambda j: j < len(recs) and recs[j].recorded_at_us == rec.recorded_at_us  # noqa: E731
        match e:
            case ev.ToolCallRequested() | ev.AnomalyRecorded() if (
                    not isinstance(e, ev.AnomalyRecorded) or e.kind in TOOL_CALL_ANOMALIES):
                return self._tool_calls_group(i)
            case ev.AnomalyRecorded() if e.kind in MESSAGE_ANOMALIES:
                n = 1
                if same_time(i + 1):
                    nxt = recs[i + 1].event
                    if isinstance(nxt, ev.ReconnectRequested) and nxt.reason == e.kind:
                        n = 2
                detail = e.detail if isinstance(e.detail, dict) else {}
                return ServerMessageRejected(e.kind, detail, e.generation), n
            case ev.BotStartedSpeaking():
                return SpeechStarted(e.generation, e.source), 1
            case ev.BotStoppedSpeaking():
                return SpeechStopped(e.generation, e.source), 1
            case ev.Interrupted():
                return InterruptionObserved(e.generation), 1
            case ev.SettingsChanged():
                n = 1
                if same_time(i + 1):
                    nxt = recs[i + 1].event
                    if isinstance(nxt, ev.ReconnectRequested) and nxt.reason == "settings":
                        n = 2
                return SettingsUpdate(tuple(e.keys), dict(e.values), e.needs_reconnect), n
            case ev.GoAwayReceived():
                return GoAway(e.generation, e.time_left_s), 1
            case ev.ToolCallCancelled(reason="server") | ev.AnomalyRecorded(
                    kind="cancellation_for_unknown_call"):
                ids_, j, gen = [], i, None
                while same_time(j):
                    x = recs[j].event
                    if isinstance(x, ev.ToolCallCancelled) and x.reason == "server":
                        ids_.append(x.call_id)
                    elif (isinstance(x, ev.ToolCallCancelled)
                          and x.reason == "reissue_cancelled"):
                        pass  # decided with the cancellation of the id that re-asked for it
                    elif (isinstance(x, ev.AnomalyRecorded)
                          and x.kind == "cancellation_for_unknown_call"):
                        ids_.append((x.detail or {}).get("call_id"))
                        gen = x.generation
                    else:
                        break
                    j += 1
                return CancellationArrived(tuple(ids_), gen or self.state.generation), j - i
        return None

    def _tool_calls_group(self, i: int) -> tuple[Observation, int]:
        """Rebuild the ToolCallsArrived a group of call events was decided on."""
        recs, at = self.recs, self.recs[i].recorded_at_us
        calls: list[FunctionCall] = []
        index: dict[str, int] = {}  # call id -> its FunctionCall in `calls`
        made_up: set[str] = set()  # ids the shell made (logged just before their request)
        j, gen = i, None
        while j < len(recs) and recs[j].recorded_at_us == at:
            x = recs[j].event
            d = x.detail if isinstance(x, ev.AnomalyRecorded) and isinstance(x.detail, dict) \
                else {}
            if isinstance(x, ev.ToolCallRequested):
                index[x.call_id] = len(calls)
                calls.append(FunctionCall(x.call_id, x.name, x.args,
                                          id_generated=x.call_id in made_up))
            elif isinstance(x, ev.AnomalyRecorded) and x.kind == "tool_call_without_id" \
                    and d.get("call_id"):
                made_up.add(d["call_id"])
            elif isinstance(x, ev.AnomalyRecorded) and x.kind in CALL_REFUSALS \
                    and d.get("call_id") in index:
                at_ = index[d["call_id"]]
                call = calls[at_]
                if x.kind == "unknown_tool":
                    call = dataclasses.replace(call, has_handler=False)
                elif x.kind == "tool_args_too_large" and isinstance(d.get("bytes"), int):
                    pad = max(d["bytes"] - len('{"_":""}'), 0)  # same size, same refusal
                    call = dataclasses.replace(call, args={"_": "x" * pad})
                    self._args_not_logged.add(call.call_id)
                elif x.kind == "invalid_tool_args":
                    call = dataclasses.replace(call, args={"_": float("nan")})
                    self._args_not_logged.add(call.call_id)
                calls[at_] = call
            elif isinstance(x, ev.AnomalyRecorded) and x.kind in TOOL_CALL_ANOMALIES:
                calls.append(FunctionCall(
                    d.get("call_id") if x.kind != "tool_call_without_id" else None,
                    d.get("name") if x.kind != "tool_call_without_name" else None,
                    d.get("args", {})))
            elif not (isinstance(x, (ev.ToolCallDeferred, ev.ToolCallCompleted,
                                     ev.ToolCallReissued, ev.ToolCallFailed))
                      and x.call_id in index
                      and (not isinstance(x, ev.ToolCallCompleted) or x.reused_from)
                      and (not isinstance(x, ev.ToolCallFailed) or not x.outcome_unknown)):
                break
            if isinstance(x, (ev.ToolCallRequested, ev.AnomalyRecorded)):
                gen = x.generation if gen is None else gen
            j += 1
        return ToolCallsArrived(tuple(calls), gen or 0), j - i

    # ------------------------------------------------------------------ checks
    def diverge(self, first: int, last: int, kind: str, message: str, obs, logged, decided):
        self.report.divergences.append(Divergence(
            first, last, kind, message, observation_json(obs) if obs is not None else None,
            logged, decided))

    def check_decision(self, i: int, obs: Observation, n: int) -> None:
        grecs = self.recs[i:i + n]
        logged = [r.event for r in grecs]
        decided = decide(self.state, obs, self.policy)
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
                        not x.confirmed and x.generation == e.generation for x in call.sends):
                    return  # the confirmation of a send already checked
                if e.via == "seed":
                    self.check_seed(rec, e, call)
                    return
                effects = due(s, self.policy, t)
                send = next((x for x in effects if isinstance(x, SendResult)
                             and x.call_id == e.call_id), None)
                if send is None:
                    why = ("its result is already in the model's state: this is a duplicate"
                           if call is not None and s.in_model(call) else
                           "it has no outcome yet" if call is None or not call.has_outcome else
                           "no live session" if not s.connected else "nothing to send")
                    self.effect_diverges(rec, f"the log sends {e.call_id} via {e.via} on "
                                         f"generation {e.generation}; today's code would not "
                                         f"send it: {why}", effects)
                elif send.via != e.via or e.generation != s.generation:
                    self.effect_diverges(rec, f"the log sends {e.call_id} via {e.via} on "
                                         f"generation {e.generation}; today's code: via "
                                         f"{send.via} on generation {s.generation}", effects)
            case ev.Disconnected(reason=reason) if reason in ("settings", "go_away",
                                                               *RESYNC_KINDS):
                effects = due(s, self.policy, t)
                if not any(isinstance(x, Reconnect) for x in effects):
                    why = ("the bot is still speaking" if s.bot_speaking else
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
                # Before `passed_over` was logged, every failure passed its handle over.
                if isinstance(d.get("handle"), str) and d.get("passed_over", True):
                    self.passed_over.add(d["handle"])
                return
            case ev.WorkerAttached():
                self.passed_over.clear()
                return
            case ev.Connected():
                fallback, self.failed_handshake = self.failed_handshake, False
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
        `due` send): only on the current, fresh generation, and only a call with an outcome,
        which is what `seed_history` includes."""
        s = self.state
        self.report.effects_checked += 1
        info = s.generations.get(s.generation)
        why = ("no such call" if call is None else
               f"it has no outcome yet (status {call.status})" if not call.has_outcome else
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
        try:
            while i < len(self.recs):
                found = self.group(i)
                if found is not None:
                    obs, n = found
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


def _why_not_start(s: SessionState, call, mine: list, policy: Policy) -> str:
    if call is None:
        return "no such call was requested"
    if any(isinstance(x, ResolveInDoubt) for x in mine):
        return "it is in doubt and the tool is not idempotent: answer 'outcome unknown' instead"
    if call.status == "deferred" and s.bot_speaking:
        return "it is deferred and the bot is still speaking"
    if call.status == "requested" and s.bot_speaking and policy.defers(call.name):
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
