"""The event catalogue of one call's stream: every fact the log records, by kind.

Each event is a frozen dataclass registered under a stable type name and a schema version;
how they are stored and read back (canonical JSON, decoding, upcasters for older schema
versions, the errors for unknown types and too-new schemas) is codec.py, whose public names
are re-exported here so that `events` is the one place to import events from.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from .codec import (MAX_NESTING, Event, canonical_json, catalogue, decode,  # noqa: F401 - re-exported: events.X is the catalogue's public face
                    event_type, nested_too_deeply, upcaster)


# --------------------------------------------------------------------------- session

@event_type("session.opened")
class SessionOpened(Event):
    model: str
    tools: list[str]
    worker: str
    epoch: int = 1
    settings: dict[str, Any] = field(default_factory=dict)


@event_type("session.worker_attached")
class WorkerAttached(Event):
    """A worker took the call over (after a crash, or a deploy): its epoch fences the old one."""
    worker: str
    epoch: int
    reason: str = "takeover"


@event_type("session.closed")
class SessionClosed(Event):
    reason: str = "ended"


# --------------------------------------------------------------------------- connection

@event_type("connection.connected")
class Connected(Event):
    """A live session is ready (setupComplete). `handle` is the one resumed from, if any."""
    generation: int
    handle: str | None = None
    system_instruction_sha256: str | None = None


@event_type("connection.disconnected")
class Disconnected(Event):
    generation: int
    reason: str  # settings | go_away | error | shutdown | handshake_failed
    detail: str = ""
    #: The session got a server message: a run of connection failures ends at it (False
    #: continues the run; logs before the field count as heard, so a run ends there).
    heard: bool = True


@event_type("connection.handle_issued", schema=2)
class HandleIssued(Event):
    """A resumable session handle (valid ~2 h): a new worker can resume with it."""
    generation: int
    handle: str
    last_consumed_client_message_index: int | None = None


@upcaster("connection.handle_issued", 1)
def _handle_issued_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    # Schema 1 did not record the index; None means "not reported by the server".
    data.setdefault("last_consumed_client_message_index", None)
    return data


@event_type("connection.handle_withheld")
class HandleWithheld(Event):
    """A resumable handle no session resumes from: the server may have issued it before it
    read what the client had just sent as content (a fresh session's seed, a result as
    content). Such a handle crosses the content on the wire (seen: Gemini's first message
    on a session, right after setupComplete), so the client reads it after the send and the
    log would order it after the send: "held", though its state lacks the seed (the
    conversation, its results) or the result. Kept for the audit. A session's handles count
    again from the model's first reaction to what was sent."""
    generation: int
    handle: str


@event_type("connection.send_unread")
class SendUnread(Event):
    """Something went out on `generation` that the server gives no sign of having read (a
    seed, a result as content or text, a contextUpdate, a NON_BLOCKING call's response):
    its handles are withheld (HandleWithheld) until the model is seen to react to it
    (ModelReacted). `turn_under_way`: a model turn was under way at the send; its output
    does not count, only that of a turn begun after it (EarlierTurnEnded). Logged before
    the send, with the next commit (session_store.withholding)."""
    generation: int
    turn_under_way: bool = False


@event_type("connection.earlier_turn_ended")
class EarlierTurnEnded(Event):
    """The model turn under way at an unread send on `generation` ended (turnComplete or
    interrupted): the model's next output is its reaction to what was sent."""
    generation: int


@event_type("connection.model_reacted")
class ModelReacted(Event):
    """The model was seen to react to what went out unread on `generation` (its first
    output of a turn begun after the send: audio, a transcript, a toolCall, turnComplete):
    the session's handles hold it, and are issued again."""
    generation: int


@event_type("connection.holds_all")
class HoldsAll(Event):
    """The session of `generation` holds all it was told: resumed from a handle (its
    history came with it), or a fresh session with nothing to seed. Its handles are issued
    (until something goes out unread)."""
    generation: int


@event_type("connection.handle_refused")
class HandleRefused(Event):
    """A resumption handle no session resumes from again, whichever worker asks: the server
    refused a setup resuming from it ("refused": closed 1007/1008 before setupComplete, the
    handle expired or unknown), or failed on it `failures` handshakes in a row ("failing").
    `generation` is the session that issued it (0: not a handle the log holds)."""
    generation: int
    handle: str
    reason: str  # refused | failing
    failures: int = 1


@event_type("connection.go_away")
class GoAwayReceived(Event):
    generation: int
    time_left_s: float


@event_type("connection.reconnect_requested")
class ReconnectRequested(Event):
    reason: str  # settings | go_away | cut_turn | send_failed | a resync's kind
    keys: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- speech

@event_type("model.interaction_status")
class InteractionStatus(Event):
    """What a model that reports `interaction_status` (3.8 thinking) says it is doing:
    IN_PROGRESS (reasoning, waiting for a call's result; more output may follow a
    turnComplete) or IDLE. `source`: "server", or "timeout" (no word from it for long)."""
    generation: int
    status: str  # IN_PROGRESS | IDLE
    source: str = "server"


@event_type("speech.bot_started")
class BotStartedSpeaking(Event):
    generation: int
    source: str = "model"


@event_type("speech.bot_stopped")
class BotStoppedSpeaking(Event):
    generation: int
    source: str = "turn_complete"  # turn_complete | transport | timeout | interruption


@event_type("speech.interrupted")
class Interrupted(Event):
    generation: int


# --------------------------------------------------------------------------- settings

@event_type("settings.changed", schema=2)
class SettingsChanged(Event):
    """Which settings changed; `values` never holds a secret (redacted by the shell).
    `in_session`: applied to the live session by a `contextUpdate` (models that take one),
    not by a new session."""
    keys: list[str]
    values: dict[str, Any] = field(default_factory=dict)
    needs_reconnect: bool = False
    in_session: bool = False


@upcaster("settings.changed", 1)
def _settings_changed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    data.setdefault("in_session", False)  # before contextUpdate, every change reconnected
    return data


@event_type("settings.context_sending")
class ContextSending(Event):
    """Write-ahead intent: the settings changed in-session up to log version `version` are
    about to go to the session of `generation` as a `contextUpdate`."""
    generation: int
    version: int


@event_type("settings.context_sent")
class ContextSent(Event):
    """The `contextUpdate` carrying the settings as of `version` went out on `generation`."""
    generation: int
    version: int


# --------------------------------------------------------------------------- tools

@event_type("tool.call_requested", schema=2)
class ToolCallRequested(Event):
    """`mode`: how the server runs the call ("blocking": the model waits for the answer;
    "non_blocking": it goes on talking, and the call may get intermediate results), decided
    from the model's rules and `declared`, the behaviour the session's setup declared for
    the function (BLOCKING, NON_BLOCKING, or None)."""
    call_id: str
    name: str
    args: dict[str, Any]
    generation: int
    mode: str = "blocking"
    declared: str | None = None


@upcaster("tool.call_requested", 1)
def _call_requested_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    data.setdefault("mode", "blocking")  # every call blocked before modes were logged
    return data


@event_type("tool.call_reissued")
class ToolCallReissued(Event):
    """Gemini asked again for a call it already asked for (same name and arguments) after
    its state lost the first one (resume from an older handle, fresh session, crash). The
    new id is answered with the original's outcome; the original never runs twice."""
    call_id: str
    original: str


@event_type("tool.call_deferred")
class ToolCallDeferred(Event):
    call_id: str


@event_type("tool.call_started")
class ToolCallStarted(Event):
    call_id: str
    attempt: int
    idempotency_key: str
    epoch: int


@event_type("tool.call_completed", schema=2)
class ToolCallCompleted(Event):
    """`scheduling`: for a NON_BLOCKING call, how the model takes the result (WHEN_IDLE,
    SILENT, INTERRUPT); None for a blocking call."""
    call_id: str
    result: Any
    reused_from: str | None = None
    scheduling: str | None = None


@upcaster("tool.call_completed", 1)
def _call_completed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    data.setdefault("scheduling", None)
    return data


@event_type("tool.call_progress")
class ToolCallProgress(Event):
    """An intermediate result of a NON_BLOCKING call (number `part`, from 1): sent with
    will_continue=true; the call's outcome closes it."""
    call_id: str
    part: int
    result: Any
    scheduling: str | None = None


@event_type("tool.call_failed")
class ToolCallFailed(Event):
    call_id: str
    error: str
    outcome_unknown: bool = False


@event_type("tool.call_cancelled")
class ToolCallCancelled(Event):
    call_id: str
    reason: str  # server | reissue_cancelled (the id that re-asked for it was cancelled)


@event_type("tool.outcome_checked")
class ToolOutcomeChecked(Event):
    """What a tool's outcome check said, asked by the call's idempotency key about a call
    left in doubt: "done" (its result is logged with this), "not_done" (re-run where the tool
    allows, else answered as not done), or "cannot_tell" (also a check that failed or timed
    out: `detail`; answered "outcome unknown")."""
    call_id: str
    answer: str  # done | not_done | cannot_tell
    detail: str = ""


@event_type("tool.result_sending", schema=2)
class ToolResultSending(Event):
    """Write-ahead intent: the shell is about to send this result on this generation.

    Until ToolResultSent confirms it, the send is in doubt (the process may have died, or the
    socket closed, between the two): a new session then resumes only from a handle issued
    before this intent, or starts fresh, so the result is provably absent and is sent again.
    `part`: 0 for the call's outcome, n for its intermediate result n (tool.call_progress).
    """
    call_id: str
    generation: int
    via: str  # tool_response | content (clientContent) | text (realtimeInput.text) | seed
    part: int = 0


@upcaster("tool.result_sending", 1)
def _result_sending_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    data.setdefault("part", 0)
    return data


@event_type("tool.result_sent", schema=2)
class ToolResultSent(Event):
    """The send succeeded on a live session of `generation` (the write returned)."""
    call_id: str
    generation: int
    via: str  # tool_response | content | text | seed
    part: int = 0


@upcaster("tool.result_sent", 1)
def _result_sent_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    data.setdefault("part", 0)
    return data


# --------------------------------------------------------------------------- conversation

@event_type("conversation.message", schema=2)
class ConversationMessage(Event):
    """A user or bot turn; `generation`: the session that heard or said it. `late`: the
    user's words of the turn the bot's last message answered, transcribed after that answer
    (3.x): the fold places them with that turn, not after it. `audio_s`: how long the
    audio of a bot message is, and `audio_from_us` when its first audio arrived (the
    worker's clock), so a takeover can tell how much of it can have played (None: unknown,
    or older logs)."""
    role: str  # user | assistant
    text: str
    generation: int = 0
    late: bool = False
    audio_s: float | None = None
    audio_from_us: int | None = None


@event_type("conversation.message_cut")
class ConversationMessageCut(Event):
    """The bot's last message, cut to what the caller heard: they talked over it, and its
    audio stopped (Gemini's `interrupted` during the turn, or the worker's voice detector
    after the model had finished it). It follows that message, logged whole (as the model
    said it, and as the session that said it holds it), and replaces it in the conversation;
    `text` ends with a cut mark (alone: nothing heard)."""
    text: str
    generation: int


@event_type("conversation.cut_telling")
class CutTelling(Event):
    """Write-ahead intent: the live session of `generation`, which said the turn cut at log
    version `cut`, is about to be told what the caller heard of it (`via`: "content", a
    clientContent note with turnComplete false: it does not start a reply; "reseed": it is
    replaced by a fresh session seeded from the log, the `ReconnectRequested` logged with
    it; no `cut_told` follows: that session's seed, `conversation.sent`, is the telling)."""
    generation: int
    cut: int
    via: str


@event_type("conversation.cut_told")
class CutTold(Event):
    """The note about the cut at log version `cut` went out on `generation` (the write
    returned)."""
    generation: int
    cut: int
    via: str


@event_type("conversation.cut_untold")
class CutUntold(Event):
    """The live session of `generation` is not told about the cut at log version `cut`:
    its model takes no note that would not be answered as the caller speaking (`reason`).
    It goes on believing the caller heard the whole turn; later sessions do not. Written
    by code before 2026-12-07 (3.1, 3.8 thinking); today's replaces the session instead
    (`conversation.cut_telling` via "reseed")."""
    generation: int
    cut: int
    reason: str


@upcaster("conversation.message", 1)
def _conversation_message_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    data.setdefault("late", False)  # late words were logged as a turn of their own
    return data


@event_type("conversation.sending")
class ConversationSending(Event):
    """Write-ahead intent: the conversation up to log version `through` is about to go to the
    session of `generation`, as its seed (a fresh session) or as content (a resumed session
    whose handle predates turns the log has). `answer`: the model is asked to answer it
    (a seed's turnComplete, session_store.seeding; False in logs from before it was
    logged, whatever that shell asked)."""
    generation: int
    through: int
    via: str  # seed | content
    answer: bool = False


@event_type("conversation.sent")
class ConversationSent(Event):
    generation: int
    through: int
    via: str


@event_type("anomaly.recorded")
class AnomalyRecorded(Event):
    """Something malformed or unexpected arrived; kept so nothing is dropped silently."""
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)
    generation: int = 0


# --------------------------------------------------------------------------- decisions

@event_type("decision.observed")
class ObservationRecorded(Event):
    """What the decision whose `events` events follow this one was made on (the Decider's
    command): `kind` names the observation (decide.py), `data` holds its fields except
    those the following events already hold, which `refs` points at (field path -> [index
    among them, field name or None for the event itself]), so nothing is stored twice.
    `withheld`: why the observation itself is not kept (the log cannot store it). The fold
    ignores it: it is what `replay` decides again (observed.py)."""
    kind: str
    data: dict[str, Any]
    events: int
    refs: dict[str, Any] = field(default_factory=dict)
    withheld: str = ""
