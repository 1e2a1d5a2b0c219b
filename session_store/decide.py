"""Decisions on observations, as pure functions of the projected state.

`decide(state, observation, policy)` turns what the shell observed into the events to append
(write-ahead: the shell appends them before acting). What must happen next, and how results
reach the model, is `delivery.due`: live operation and crash recovery run the same functions;
after a takeover the state simply has in-doubt calls, undelivered results and no live session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import events as ev
from .delivery import SEND_FAILED, reconnect_due, session_knows_call, undelivered
from .lineage import in_model
from .models import call_mode
from .policy import Policy
from .state import CONTEXT_KEYS, CallState, SessionState
from .heard import interruption_events, takeover_events, transcript_events
from .answers import arrived_result, next_progress, stopped_failure, unless_answered
from .outcomes import CheckAnswer, NotAnAnswer, answer_events
from .seeding import seed_events
from .storable import bounded, clean, is_text, preview, storable_args
from .withholding import ModelOutputObserved, handle_event, model_output


# --------------------------------------------------------------------------- observations

@dataclass(frozen=True)
class FunctionCall:
    call_id: str | None
    name: str | None
    args: Any
    #: The server sent no id; `call_id` was made up by the shell (Vertex never sends ids;
    #: the Gemini API always should, so there it is an anomaly, still run and answered).
    id_generated: bool = False
    #: A handler (or a catch-all) is registered for `name` in the shell.
    has_handler: bool = True
    #: The behaviour the session's setup declared for `name` ("BLOCKING", "NON_BLOCKING" or
    #: None): with the model's rules it says how the server runs the call.
    declared: str | None = None


@dataclass(frozen=True)
class ToolCallsArrived:
    calls: tuple[FunctionCall, ...]
    generation: int


@dataclass(frozen=True)
class ServerMessageRejected:
    """A server message the shell could not take in (see RESYNC_KINDS); `detail` bounded."""
    kind: str
    detail: dict[str, Any]
    generation: int


@dataclass(frozen=True)
class SpeechStarted:
    generation: int
    source: str = "model"


@dataclass(frozen=True)
class SpeechStopped:
    generation: int
    source: str = "turn_complete"


@dataclass(frozen=True)
class InterruptionObserved:
    """The caller talked over the bot: Gemini's `interrupted`, or (`local`) the pipeline's
    own barge-in (its voice detector), with `model_turn`: a model turn under way then.
    `finished_turn_heard`: of the audio of the model's last finished turn, the part the
    caller heard while it still played (None: it played in full, none finished, or the
    pipeline does not know its playback). Whether and how the bot's last message is cut is
    decided on the log (heard.interruption_events)."""
    generation: int
    local: bool = False
    model_turn: bool = False
    finished_turn_heard: float | None = None


@dataclass(frozen=True)
class TranscriptFlushed:
    """What was said since the last flush (at a turn's end, a toolCall, an interruption, a
    session's end), as the shell gathered it from the transcriptions: `words`, the caller's,
    each piece with the seconds since the bot's last message when it arrived (None: no
    message stands it could belong to, none yet or the model went on since); `said`, the
    bot's; `heard_fraction`: an interrupted turn's part of its audio the caller heard (None:
    unknown, or not interrupted). Messages, late words and the cut are decided on the log
    (heard.transcript_events). `said_audio_s`: how long the audio of `said` is, as received,
    and `said_audio_from_us`: when its first audio arrived (None: unknown)."""
    generation: int
    words: tuple[tuple[str, float | None], ...] = ()
    said: str = ""
    heard_fraction: float | None = None
    said_audio_s: float | None = None
    said_audio_from_us: int | None = None


@dataclass(frozen=True)
class TakenOver:
    """This worker took the call over (its WorkerAttached is logged): the dead worker's
    playback stopped with it, and the log decides how much of the bot's last message the
    caller can have heard (heard.takeover_events). `playback_lead_s`: how far ahead of real
    time the pipeline wrote the bot's audio (it plays on after the worker died).
    `handed_over_us`: when the call was handed to this worker, if the transport knows (the
    phone bot: its stream token's issue time); the dead worker's stream had ended by then."""
    playback_lead_s: float = 0.0
    handed_over_us: int | None = None


@dataclass(frozen=True)
class SettingsUpdate:
    keys: tuple[str, ...]
    values: dict[str, Any] = field(default_factory=dict)  # already redacted by the shell


@dataclass(frozen=True)
class InteractionStatusObserved:
    generation: int
    status: str  # IN_PROGRESS | IDLE
    source: str = "server"  # server | timeout


@dataclass(frozen=True)
class CancellationArrived:
    call_ids: tuple[str, ...]
    generation: int


@dataclass(frozen=True)
class GoAway:
    """`read_at_us`: when the service read it (its clock, µs). Gemini's deadline counts from
    then; the log's from the goAway's record time, later when it waited for a commit in
    flight. Counted from its record time, the deadline was late, nothing looked again before
    Gemini closed the session mid-turn (tests/service/test_go_away_timing.py): so the time
    left is logged as it is at the record time (`now_us`, given by the shell)."""
    generation: int
    time_left_s: float
    read_at_us: int | None = None


@dataclass(frozen=True)
class SessionReady:
    """A session's setup went through (`handle`: the one it resumed from, None if fresh).
    `transport_playing`: the output transport still plays an earlier session's audio (a
    reconnect that could not wait for the turn to end), which is the bot speaking."""
    generation: int
    handle: str | None
    prompt_sha256: str
    transport_playing: bool = False


@dataclass(frozen=True)
class SessionLeft:
    """The service closes the live session for `reason` (`transport_playing`: as above;
    "error": the receive loop lost it). `heard`: the session got a server message, which
    ends a run of connection failures. `give_up_after_s`: how long such a run may go on
    before the connection is given up (the service's reconnect window; None: not judged).
    `if_due`: a planned reconnect's leave, taken only if that reconnect is still due on the
    state it is logged on: what was committed since it was found due (the bot speaking
    again, a toolCall) may make it wait (False: logs from before, left unconditionally)."""
    generation: int
    reason: str
    transport_playing: bool = False
    heard: bool = True
    give_up_after_s: float | None = None
    error: str = ""  # what lost it ("error"), bounded by the shell
    if_due: bool = False


@dataclass(frozen=True)
class HandshakeFailed:
    """A session's setup failed before setupComplete, resuming from `handle` (None: fresh).
    `error`: what failed, bounded by the shell; `close_code` and `close_reason`: the close
    the server answered the setup with (None: no close, e.g. a dropped connection, a
    timeout). Whether that is a refusal is decided here (REFUSING_CLOSE_CODES). `refused`:
    the shell's own verdict, which logs written before the close code hold instead.
    `give_up_after_s`: as SessionLeft's (None: logs from when the shell gave up itself)."""
    handle: str | None
    error: str
    close_code: int | None = None
    close_reason: str = ""
    refused: bool = False
    give_up_after_s: float | None = None


@dataclass(frozen=True)
class SendFailed:
    """A send to the session of `generation` failed (`what`: a result, a contextUpdate, the
    turns a resumed session lacks, a cut's note, a seed; `error` bounded by the shell).
    `socket_closed`: the socket is closed and the receive loop still reads it. That loop
    reconnects on the close once it has handed over what the server sent before it;
    reconnecting from the send would cancel it and lose those messages (seen: a toolCall
    right before a 1011 close, and its handle with it)."""
    generation: int
    what: str
    socket_closed: bool
    error: str = ""


@dataclass(frozen=True)
class HandleArrived:
    """Gemini issued a resumable handle on `generation` (`last_consumed_index`: the
    lastConsumedClientMessageIndex it came with, if any). Issued or withheld is decided on
    the gate the log folds (withholding.handle_event), by whichever worker reads it."""
    generation: int
    handle: str
    last_consumed_index: int | None = None


@dataclass(frozen=True)
class ToolStopped:
    """pipecat stopped a running call without a result (its timeout, or the app).
    `wire_ids`: the ids the server's cancellations named as they came off the wire, logged
    or not yet (a live set, read when this is decided)."""
    call_id: str
    wire_ids: Any


@dataclass(frozen=True)
class ResultArrived:
    """A tool's final result as pipecat hands it over (`name`: the function's, as pipecat
    says). `run_llm`: the result asks the model to answer it (pipecat's rule), which makes
    a NON_BLOCKING call's result WHEN_IDLE rather than SILENT. `again`: handed over again
    after its own append failed (that append may have committed after all)."""
    call_id: str
    name: str | None
    value: Any = None
    run_llm: bool = True
    again: bool = False


@dataclass(frozen=True)
class ResultReturned:
    """A tool's outcome, handed over again after its own append failed (logs before
    ResultArrived: read back and replayed, no longer made)."""
    call_id: str
    outcome: tuple[ev.Event, ...]


@dataclass(frozen=True)
class OutcomeAnswered:
    """What a tool's outcome check answered about a call in doubt, as it came (outcomes.py):
    a `Done` whose result the log cannot store (it may be `Unstorable`) and `NotAnAnswer`
    are judged by decide, not by the shell."""
    call_id: str
    answer: CheckAnswer | NotAnAnswer


@dataclass(frozen=True)
class ProgressReturned:
    """A tool's intermediate result (pipecat's `is_final=False`): the NON_BLOCKING call's
    next part, or dropped (logged) for any other call. `value` may be `Unstorable`."""
    call_id: str
    value: Any
    scheduling: str | None
    name: str | None = None


@dataclass(frozen=True)
class SeedAsked:
    """pipecat asks for the seed of the live session of `generation` (its first context, or
    the session came up after it; a resumed session's is asked as it comes up, since its
    handles hold all from the start): `for_reconnect`, it replaces a session lost or left;
    `inference_on_context_init`, the app asks for an answer to the opening context (both
    as pipecat passes them). What is seeded, and whether the model is asked to answer,
    is decided here (session_store.seeding)."""
    generation: int
    for_reconnect: bool = False
    inference_on_context_init: bool = False


Observation = (ToolCallsArrived | SpeechStarted | SpeechStopped | InterruptionObserved
               | SettingsUpdate | CancellationArrived | GoAway | ServerMessageRejected
               | InteractionStatusObserved | SessionReady | SessionLeft | HandshakeFailed
                | HandleArrived | ModelOutputObserved | ToolStopped | SendFailed
                | TranscriptFlushed | ResultReturned | ResultArrived | ProgressReturned
                | OutcomeAnswered | SeedAsked | TakenOver)

#: Rejected server messages after which this session's state may differ from the model's (the
#: message may have been a toolCall, a handle, a goAway ...): the session is replaced, by the
#: same rules as a settings change (after the turn; the handle the log allows), so both sides
#: continue from a state the log knows. Other kinds (an unknown message type) are only logged.
RESYNC_KINDS = frozenset({"malformed_message", "server_error_message",
                          "message_handling_failed"})

NO_NAME_ERROR = "the function call had no name: nothing was run"

#: Close codes with which the Live API refuses a setup as such, before setupComplete: 1007
#: (INVALID_ARGUMENT, "Request contains an invalid argument") and 1008 (policy violation,
#: "Requested entity was not found"). A resumption handshake closed so is the handle refused
#: (expired, unknown): the same setup cannot succeed, it is passed over at once. Anything else
#: before setupComplete (1011 "Internal error encountered" / "The service is currently
#: unavailable", also seen when a resume races the close of the session's previous socket; a
#: dropped connection; a timeout; an HTTP failure before the setup was even sent) says nothing
#: about the handle: the next try resumes from it again.
REFUSING_CLOSE_CODES = frozenset({1007, 1008})

#: Transient handshake failures in a row with one handle before it is passed over anyway (a
#: server that fails on it every time may be unable to restore it). pipecat gives the service
#: up at its third failure in a row: two leave a try for an older handle or a fresh session.
HANDLE_ATTEMPTS = 2

#: Connection failures in a row before the connection may be given up at all, whatever the
#: window: pipecat's MAX_CONSECUTIVE_FAILURES, which a window of 0 s left as it was.
GIVE_UP_FAILURES = 3


def decide(state: SessionState, obs: Observation, policy: Policy,
           now_us: int | None = None) -> list[ev.Event]:
    """The events that record `obs` and what was decided about it, recorded at `now_us`."""
    if state.closed and not isinstance(obs, ResultArrived):
        # The call is over: late signals (audio still draining) change nothing. A tool that
        # was running at the hang-up still logs its outcome (never sent: nobody is on it).
        return []
    match obs:
        case ToolCallsArrived():
            return _decide_tool_calls(state, obs, policy)
        case SpeechStarted():
            return [] if state.bot_speaking else [ev.BotStartedSpeaking(obs.generation, obs.source)]
        case SpeechStopped():
            return [ev.BotStoppedSpeaking(obs.generation, obs.source)] if state.bot_speaking else []
        case InterruptionObserved():
            return interruption_events(state, obs.generation, obs.local, obs.model_turn,
                                       obs.finished_turn_heard)
        case TranscriptFlushed():
            return transcript_events(state, obs.generation, obs.words, obs.said,
                                     obs.heard_fraction, obs.said_audio_s,
                                     obs.said_audio_from_us)
        case TakenOver():
            return takeover_events(state, now_us, obs.playback_lead_s, obs.handed_over_us)
        case SettingsUpdate():
            # Nothing else in a Gemini Live setup applies to a running session: the system
            # instruction and tools go in by contextUpdate where the model takes one; every
            # other change needs a new session (buffered while the bot speaks).
            in_session = set(obs.keys) <= CONTEXT_KEYS and state.rules.context_update
            out: list[ev.Event] = [ev.SettingsChanged(list(obs.keys), dict(obs.values),
                                                      not in_session, in_session)]
            if not in_session:
                out.append(ev.ReconnectRequested("settings", list(obs.keys)))
            return out
        case InteractionStatusObserved():
            if (not state.rules.interaction_status or obs.generation != state.generation
                    or (obs.status == "IN_PROGRESS") == (not state.interaction_idle)):
                return []
            return [ev.InteractionStatus(obs.generation, obs.status, obs.source)]
        case CancellationArrived():
            return _decide_cancellation(state, obs)
        case GoAway():
            left = obs.time_left_s
            if obs.read_at_us is not None and now_us is not None:
                left = max(left - (now_us - obs.read_at_us) / 1e6, 0.0)
            return [ev.GoAwayReceived(obs.generation, left)]
        case SessionReady():
            # A new session ends the projection's speech, but the transport may still be
            # playing the old one's audio: deferred calls keep waiting for it to stop.
            return [ev.Connected(obs.generation, obs.handle, obs.prompt_sha256),
                    *_still_playing(obs)]
        case SessionLeft():
            if not state.connected or (obs.if_due and not _leave_due(state, obs, policy,
                                                                      now_us)):
                return []
            gone: list[ev.Event] = [ev.Disconnected(obs.generation, obs.reason, obs.error,
                                                    heard=obs.heard), *_still_playing(obs)]
            if obs.reason == "error":
                # Counted as the fold will: a session that got a message starts a new run.
                earlier = (0, None) if obs.heard else (state.failures_in_row,
                                                       state.failing_since_us)
                gone += _give_up(state, policy, obs.give_up_after_s, now_us, *earlier,
                                 obs.error)
            return gone
        case HandshakeFailed():
            return [*_decide_handshake(state, obs),
                    *_give_up(state, policy, obs.give_up_after_s, now_us,
                              state.failures_in_row, state.failing_since_us, obs.error)]
        case SendFailed():
            return _decide_send_failed(state, obs)
        case HandleArrived():
            return [handle_event(state.withholding, obs.generation, obs.handle,
                                 obs.last_consumed_index)]
        case ModelOutputObserved():
            moved = model_output(state.withholding, obs.generation, reaction=obs.reaction,
                                 turn_ended=obs.turn_ended)
            return [] if moved is None else [moved]
        case ToolStopped():
            return stopped_failure(state, obs.call_id, obs.wire_ids)
        case ResultReturned():
            return unless_answered(state, obs.call_id, list(obs.outcome))
        case ResultArrived():
            return arrived_result(state, obs.call_id, obs.name, obs.value, obs.run_llm,
                                  obs.again)
        case ProgressReturned():
            return next_progress(state, obs.call_id, obs.value, obs.scheduling, obs.name)
        case OutcomeAnswered():
            return answer_events(state, obs.call_id, obs.answer, policy)
        case SeedAsked():
            return seed_events(state, obs.generation, obs.for_reconnect,
                               obs.inference_on_context_init)
        case ServerMessageRejected():
            out = [ev.AnomalyRecorded(obs.kind, bounded(obs.detail), obs.generation)]
            # Only for the live session: one from a session already left needs nothing more.
            if (obs.kind in RESYNC_KINDS and state.connected and obs.generation == state.generation
                    and not state.reconnect_pending):
                out.append(ev.ReconnectRequested(obs.kind))
            return out
    raise TypeError(f"unknown observation {obs!r}")


def handshake_refused(obs: HandshakeFailed) -> bool:
    """Did the server refuse the setup itself: a close code that says so, or (a log from
    before the code was logged) the shell's verdict?"""
    return obs.refused or obs.close_code in REFUSING_CLOSE_CODES


def handshake_verdict(state: SessionState, handle: str, refused: bool, earlier: int = 0
                      ) -> tuple[int, bool]:
    """A failed handshake resuming from `handle`: its failures in a row (those the log folded,
    `earlier` ones not logged yet, and this one), and whether the handle is passed over. Only
    a refusal says the handle is bad; a transient failure (a 1011, a dropped connection)
    retries it, up to HANDLE_ATTEMPTS: an older handle, or a fresh session, lacks what the
    conversation gained since (spoken turns are not sent again)."""
    failures = state.handshake_failures.get(handle, 0) + earlier + 1
    return failures, refused or failures >= HANDLE_ATTEMPTS


def _decide_handshake(state: SessionState, obs: HandshakeFailed) -> list[ev.Event]:
    detail: dict[str, Any] = {"handle": obs.handle, "error": obs.error}
    if obs.close_code is not None:
        detail["close_code"] = obs.close_code
    facts: list[ev.Event] = []
    if obs.handle:
        refused = handshake_refused(obs)
        failures, passed_over = handshake_verdict(state, obs.handle, refused)
        if passed_over:  # for good, by whichever worker picks the next handle
            known = state.handles.get(obs.handle)
            facts.append(ev.HandleRefused(known.generation if known else 0, obs.handle,
                                          "refused" if refused else "failing", failures))
        detail.update(handle_refused=refused, failures=failures, passed_over=passed_over)
    return [ev.AnomalyRecorded("handshake_failed", detail, state.generation), *facts]


def gives_up(failures: int, since_us: int, now_us: int, window_s: float) -> bool:
    """Is a run of `failures` connection failures in a row, the first at `since_us`, given
    up at `now_us`? Only once `window_s` has passed since the first, and never before
    GIVE_UP_FAILURES: a Gemini blip of a few seconds must not end the call."""
    return failures >= GIVE_UP_FAILURES and now_us - since_us >= int(window_s * 1e6)


def _give_up(state: SessionState, policy: Policy, window_s: float | None, now_us: int | None,
             earlier: int, since_us: int | None, error: str) -> list[ev.Event]:
    """The `connection_given_up` outcome, once, if this failure (after `earlier` ones in its
    run, the first at `since_us`) ends the window; with the call's end if the policy says
    so (Policy.end_call_on_give_up). Without a window (an older shell gave up itself) or a
    clock, nothing is decided here."""
    if window_s is None or now_us is None or state.given_up:
        return []
    failures, since = earlier + 1, now_us if since_us is None else since_us
    if not gives_up(failures, since, now_us, window_s):
        return []
    out: list[ev.Event] = [ev.AnomalyRecorded("connection_given_up", {
        "failures": failures, "error": bounded(error), "window_s": window_s,
        "failing_for_s": round((now_us - since) / 1e6, 3),
        "undelivered": [c.call_id for c in undelivered(state)][:20]}, state.generation)]
    if policy.end_call_on_give_up is not None:
        out.append(ev.SessionClosed(policy.end_call_on_give_up))
    return out


def _decide_send_failed(state: SessionState, obs: SendFailed) -> list[ev.Event]:
    """A closed socket is the receive loop's to report (SessionLeft) and replace: nothing
    here. Any other failure leaves a socket that cannot be trusted: logged, and the live
    session replaced at once (delivery.SEND_FAILED); what was not confirmed is sent again
    by the delivery rules, to the next session."""
    if obs.socket_closed:
        return []
    out: list[ev.Event] = [ev.AnomalyRecorded("send_failed", {
        "what": obs.what, "error": bounded(obs.error)}, obs.generation)]
    if (state.connected and obs.generation == state.generation
            and state.reconnect_pending != SEND_FAILED):
        out.append(ev.ReconnectRequested(SEND_FAILED))
    return out


def _leave_due(state: SessionState, obs: SessionLeft, policy: Policy,
               now_us: int | None) -> bool:
    """Is the planned reconnect `obs` leaves for due on this state (a failed send's: its own,
    whatever the turn)? As replay checks a logged Disconnected."""
    reconnect = reconnect_due(state, policy, 0 if now_us is None else now_us)
    return reconnect is not None and (obs.reason != SEND_FAILED
                                      or reconnect.reason == SEND_FAILED)


def _still_playing(obs: SessionReady | SessionLeft) -> list[ev.Event]:
    return ([ev.BotStartedSpeaking(obs.generation, "transport")] if obs.transport_playing
            else [])


def _decide_tool_calls(state: SessionState, obs: ToolCallsArrived, policy: Policy
                       ) -> list[ev.Event]:
    """Record each call and what to do about it. Every call the server can be answered for is
    recorded and ends answered (I1): a call that cannot run (no name, no such tool, arguments
    too large or not valid JSON) fails at once with an explicit error, which the delivery
    rules send like any result. What cannot be answered is logged instead: a call with
    neither id nor name (nothing to address an answer to), a repeated id (answering it would
    answer that id twice, running it would run one request twice), and an id or name that is
    not valid text (it cannot be stored, so not answered either: the session is resynced)."""
    out: list[ev.Event] = []
    seen: set[str] = set()
    for call in obs.calls:
        gen = obs.generation
        name = call.name if isinstance(call.name, str) else ""
        if not name and (call.id_generated or not call.call_id):
            out.append(ev.AnomalyRecorded("tool_call_without_name",
                                          {"call_id": None, "args": preview(call.args)}, gen))
            continue
        if not call.call_id or not isinstance(call.call_id, str):  # the shell always makes one
            out.append(ev.AnomalyRecorded("tool_call_without_id",
                                          {"name": clean(name), "args": preview(call.args)},
                                          gen))
            continue
        if not (is_text(call.call_id) and is_text(name)):
            out += decide(state, ServerMessageRejected("malformed_message", {
                "what": "a function call whose id or name is not valid text",
                "call_id": clean(call.call_id), "name": clean(name)}, gen), policy)
            continue
        if call.id_generated:
            out.append(ev.AnomalyRecorded("tool_call_without_id",
                                          {"call_id": call.call_id, "name": name}, gen))
        if state.knows_call_id(call.call_id) or call.call_id in seen:
            # (Where the first one is: nothing about it that a compacted state may not know.)
            out.append(ev.AnomalyRecorded("duplicate_tool_call_id", {
                "call_id": call.call_id, "name": name,
                "first": "same_tool_call" if call.call_id in seen else "earlier_call",
                "args": preview(call.args)}, gen))
            continue
        seen.add(call.call_id)
        args, size = storable_args(call.args)
        mode = call_mode(state.rules, call.declared)
        out.append(ev.ToolCallRequested(call.call_id, name, args, gen, mode, call.declared))
        refused: tuple[str, dict[str, Any], str] | None = None
        if not name:
            refused = ("tool_call_without_name", {"call_id": call.call_id}, NO_NAME_ERROR)
        elif size is None:
            refused = ("invalid_tool_args", {"call_id": call.call_id, "name": name,
                                             "args": args["_invalid"]},
                       "the arguments are not valid JSON (NaN, or text that is not "
                       "valid Unicode): nothing was run")
        elif size > policy.max_args_bytes:
            args = {"_omitted_bytes": size, "_preview": preview(args)}
            out[-1] = ev.ToolCallRequested(call.call_id, name, args, gen, mode, call.declared)
            refused = ("tool_args_too_large",
                       {"call_id": call.call_id, "name": name, "bytes": size,
                        "limit": policy.max_args_bytes},
                       f"the arguments are too large ({size} bytes; the limit is "
                       f"{policy.max_args_bytes}): nothing was run")
        elif not call.has_handler:
            refused = ("unknown_tool", {"call_id": call.call_id, "name": name},
                       f"no function named {name!r} is available: nothing was run")
        if refused is not None:
            kind, detail, error = refused
            out += [ev.AnomalyRecorded(kind, detail, gen), ev.ToolCallFailed(call.call_id, error)]
            continue
        earlier = (find_equivalent(state, name, args, int(policy.crossing_window_s * 1e6))
                   if policy.reuses(name) else None)
        if earlier is not None and earlier.status == "completed":
            # Gemini re-asked after resuming from a state that lost the first answer.
            out.append(ev.ToolCallCompleted(call.call_id, earlier.result,
                                            reused_from=earlier.call_id))
        elif earlier is not None:
            # The original has no delivered answer yet (deferred, running, in doubt after a
            # crash, or failed): link them; the tool never runs twice for one request.
            out.append(ev.ToolCallReissued(call.call_id, earlier.call_id))
        elif state.bot_speaking and policy.defers(name, mode):
            out.append(ev.ToolCallDeferred(call.call_id))
    return out


def find_equivalent(state: SessionState, name: str, args: dict[str, Any],
                    crossing_window_us: int = 0) -> CallState | None:
    """An earlier call with the same name and arguments that Gemini is re-asking for:
    the current session never issued it (it resumed from a state before it, or started
    fresh), and its answer is not in the current model state — or it reached this
    session only as content within `crossing_window_us` of now, so the new request may
    have crossed it on the wire (the model asked before it read the answer). None
    otherwise: an equal call in the session that issued the first is a request of its
    own (two parallel lookups, the user asking twice), and both ids await an answer."""
    for c in state.calls.values():
        if (c.name == name and c.args == args and c.status != "cancelled"
                and not c.superseded_by and not session_knows_call(state, c)
                and (not in_model(state, c) or _crossed(state, c, crossing_window_us))):
            return c
    return None


def _crossed(state: SessionState, call: CallState, window_us: int) -> bool:
    sends = [s for s in call.sends if s.confirmed and s.generation == state.generation]
    return bool(sends) and all(s.via != "tool_response" for s in sends) and any(
        state.last_event_at_us - s.at_us <= window_us for s in sends)

def _decide_cancellation(state: SessionState, obs: CancellationArrived) -> list[ev.Event]:
    out: list[ev.Event] = []
    cancelled: set[str] = set()
    for call_id in obs.call_ids:
        call = state.calls.get(call_id)
        if call_id in state.archived:
            continue  # answered (or cancelled) for good: nothing left to cancel
        if call is None:
            out.append(ev.AnomalyRecorded("cancellation_for_unknown_call",
                                          {"call_id": clean(str(call_id))}, obs.generation))
        elif (call.status != "cancelled" and call_id not in cancelled
              and not (call.has_outcome and in_model(state, call))):
            out.append(ev.ToolCallCancelled(call_id, "server"))
            cancelled.add(call_id)
            # A re-issued id stands for its original (the model lost the first id): the
            # request is cancelled, so the original must not start (or go on) for it.
            for original in cancelled_with(state, (call_id,))[1:]:
                if (original.status != "cancelled" and not original.has_outcome
                        and original.call_id not in cancelled):
                    out.append(ev.ToolCallCancelled(original.call_id, "reissue_cancelled"))
                    cancelled.add(original.call_id)
    return out


def cancelled_with(state: SessionState, call_ids) -> list[CallState]:
    """The calls a cancellation of these ids reaches: each known call, then the originals
    it re-asks for (`reissue_of`, transitively), in that order, each once."""
    found: list[CallState] = []
    seen: set[str] = set()
    for call_id in call_ids:
        call = state.calls.get(call_id) if isinstance(call_id, str) else None
        while call is not None and call.call_id not in seen:
            seen.add(call.call_id)
            found.append(call)
            call = state.calls.get(call.reissue_of) if call.reissue_of else None
    return found
