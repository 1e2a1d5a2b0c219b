"""A call's state: what the fold of its events (projection.py) builds, as plain data.

Data and the accessors that only read it; the rules that answer what a model state holds
(lineage.py), what is due (delivery.py) and what a snapshot keeps (compaction.py) are
functions of it, elsewhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .models import ModelRules, rules_for


class HistoryNeeded(LookupError):
    """The state was compacted (loaded from a snapshot) and this needs what compaction left
    out: the conversation, or a call archived as settled for good. Load the whole log."""


OUTCOMES = ("completed", "failed")
#: Settings a model state holds as part of its context: a session resumed from a handle keeps
#: what its state had (whether it adopts a new value from its setup is undocumented), so a
#: change reaches it only by a `contextUpdate` or a fresh session.
CONTEXT_KEYS = frozenset({"system_instruction", "tools"})


@dataclass
class Send:
    generation: int
    via: str
    version: int  # log version of the event: orders the send against handles
    confirmed: bool = False
    at_us: int = 0  # when the send was confirmed


@dataclass
class Cover:
    """A send that covers everything up to log version `through`: a `contextUpdate` (the
    in-session settings as of `through`) or a conversation seed / catch-up (the turns logged
    up to `through`). Held by a model state like a result's send (`send_held`)."""
    generation: int
    via: str
    version: int
    through: int
    confirmed: bool = False


@dataclass
class Progress:
    """An intermediate result of a NON_BLOCKING call (will_continue=true on the wire)."""
    part: int
    result: Any
    scheduling: str | None
    at_us: int
    sends: list[Send] = field(default_factory=list)


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
    sends: list[Send] = field(default_factory=list)  # of the outcome
    mode: str = "blocking"  # blocking | non_blocking (how the server runs it)
    scheduling: str | None = None  # of the outcome (NON_BLOCKING calls)
    progress: list[Progress] = field(default_factory=list)
    # What its outcome check answered since it last started (ToolOutcomeChecked), if asked.
    checked: str | None = None
    # Its outcome was logged after the call ended (a tool still running at the hang-up).
    finished_after_end: bool = False

    @property
    def has_outcome(self) -> bool:
        return self.status in OUTCOMES

    def sends_of(self, part: int) -> list[Send]:
        """The sends of the outcome (part 0) or of intermediate result `part`."""
        return self.sends if part == 0 else self.progress[part - 1].sends


@dataclass
class Playing:
    """The bot's last message while its audio may still be playing (`audio_s` long, its
    first audio received at `started_us`): a takeover decides how much of it the caller can
    have heard (heard.takeover_events)."""
    text: str
    generation: int
    started_us: int
    audio_s: float


@dataclass
class CutNote:
    """A bot turn the caller cut short, owed a note by the live session that said it
    (ConversationMessageCut at log version `cut`, `heard`: what they heard of it). `via` is
    set by the intent (CutTelling); the note leaves the state once told or decided untold,
    or when its session ends (a later session is seeded with the heard part, or resumes
    from a handle that does not hold the turn whole: choose_resumption)."""
    cut: int
    generation: int
    heard: str
    via: str | None = None


@dataclass
class Generation:
    generation: int
    version: int
    handle: str | None  # the handle it resumed from; None = fresh
    parent: int | None  # generation whose state it resumed
    parent_cutoff: int | None  # log version of that handle: state as of then
    # The in-session settings its state started with (log version of the last change it
    # holds): a fresh session's setup carries them all; a resumed one inherits its handle's.
    context_base: int = 0
    #: Its seed was decided (session_store.seeding): intents logged, or it holds all (a
    #: resumed session, or nothing to seed). Until then a fresh session takes no result on
    #: its own: the seed carries every result the log has.
    seeded: bool = False


@dataclass
class Handle:
    handle: str
    generation: int
    version: int
    issued_at_us: int
    last_consumed_client_message_index: int | None = None
    # The server refused to resume from it, or failed on it every time (HandleRefused): no
    # session resumes from it again, whichever worker asks.
    refused: bool = False


@dataclass(frozen=True)
class Withholding:
    """Whose handles may be resumed from (session_store.withholding): folded from the
    `connection.send_unread`, `earlier_turn_ended`, `model_reacted` and `holds_all` events,
    so every worker and `replay` decide a handle on the same gate."""
    #: The generation whose handles hold all it was told (0: none).
    holds_sends: int = 0
    #: The generation with a send (a seed, content) not yet seen read (0: none).
    unread_send: int = 0
    #: A model turn was under way at that send: a reaction counts only from the next turn.
    turn_at_send: bool = False


#: A call's fencing epoch once a worker took it over (the first worker opens it at 1): from
#: then on the store fences an append that passes no epoch unless it says `unfenced`.
TAKEN_OVER = 2


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
    # Handshakes that failed in a row, per handle they resumed from (the `handshake_failed`
    # anomalies since the last Connected): every worker counts them alike (HANDLE_ATTEMPTS).
    handshake_failures: dict[str, int] = field(default_factory=dict)
    # The connection failures in a row (failed handshakes, sessions lost to an error) since
    # the last session that got a server message, and when the first was recorded: the log's
    # clock, so a takeover and replay judge the same give-up window (decide.gives_up).
    failures_in_row: int = 0
    failing_since_us: int | None = None
    # The connection was given up (a `connection_given_up` anomaly): no reconnect is due
    # until a takeover or a session that comes up after all.
    given_up: bool = False
    # Which of a session's handles are issued or withheld (withholding.py).
    withholding: Withholding = field(default_factory=Withholding)
    reconnect_pending: str | None = None
    reconnect_keys: list[str] = field(default_factory=list)
    # A reconnect asked for while no session was up (between a Disconnected and the next
    # Connected): the session that comes up may not carry what it asked for (a prompt
    # changed during the handshake), so it stays pending past that Connected.
    reconnect_requested_offline: bool = False
    go_away_deadline_us: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    # Models that report interaction_status: whether the live session said IDLE last (a new
    # session starts idle).
    interaction_idle: bool = True
    # Log version of the last change to a CONTEXT_KEYS setting (0: none since the call opened).
    context_version: int = 0
    context_sends: list[Cover] = field(default_factory=list)
    conversation_sends: list[Cover] = field(default_factory=list)
    # (log version, generation that heard it) of each conversation message, in log order.
    message_marks: list[tuple[int, int]] = field(default_factory=list)
    # The mark of the bot's last message: late user words are heard before it (ConversationMessage).
    answer_mark: tuple[int, int] | None = None
    # The bot's last message as logged whole, (text, generation that said it), while a
    # barge-in may still cut it (its audio may still be playing): cleared by its cut, by an
    # interruption (which consults it once) and by a takeover (nothing of it plays there).
    uncut_answer: tuple[str, int] | None = None
    # The bot's last message while its audio may still play: cleared by its cut, an
    # interruption, or the speech stopping for any reason but the model's turnComplete (the
    # transport plays on). A takeover keeps it: the dead worker's playback stopped in it.
    playing: Playing | None = None
    calls: dict[str, CallState] = field(default_factory=dict)
    # The conversation in log order: (role, text) for user/assistant turns and
    # ("tool", call_id) where a call was made; a fresh session is seeded from it.
    conversation: list[tuple[str, str]] = field(default_factory=list)
    # Bot messages the caller heard only part of (ConversationMessageCut): (the log version
    # of the turn before, generation that said it). That generation's model state holds the
    # whole turn from then on: no session resumes it (delivery.choose_resumption).
    cut_turns: list[tuple[int, int]] = field(default_factory=list)
    # Cuts the live session that said the turn is still owed a note about (CutNote).
    cut_notes: list[CutNote] = field(default_factory=list)
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

    @property
    def rules(self) -> ModelRules:
        """The wire rules of the model the call runs on now (it may change by settings)."""
        model = self.settings.get("model")
        return rules_for(model if isinstance(model, str) and model else self.model)

    @property
    def idle(self) -> bool:
        """A safe point for a planned reconnect: the bot is silent and, on a model that
        reports interaction_status, the server said IDLE (a turnComplete is not enough)."""
        return not self.bot_speaking and (self.interaction_idle
                                          or not self.rules.interaction_status)

    def require_history(self) -> None:
        if not self.history_complete:
            raise HistoryNeeded(f"{self.stream_id}: this state was compacted; load the whole "
                                "log for its conversation")

    # ---------------------------------------------------------------- derived views
    def pending(self) -> list[CallState]:
        """Deferred calls, in request order: they start when the bot stops speaking."""
        return [c for c in self.calls.values() if c.status == "deferred"]

    def in_doubt(self) -> list[CallState]:
        """Started by an earlier worker and never finished, or still unfinished when the
        call ended (nobody is left to run it): the outcome is unknown."""
        return [c for c in self.calls.values() if c.status == "started"
                and (self.closed or (c.started_epoch or 0) < self.epoch)]

    def running(self) -> list[CallState]:
        """Started by this worker and not finished; none once the call ended."""
        return [c for c in self.calls.values() if c.status == "started" and not self.closed
                and (c.started_epoch or 0) >= self.epoch]

    def finished_after_end(self) -> list[CallState]:
        return [c for c in self.calls.values() if c.finished_after_end]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["conversation"] = [list(m) for m in self.conversation]
        data["message_marks"] = [list(m) for m in self.message_marks]
        data["cut_turns"] = [list(m) for m in self.cut_turns]
        data["archived"] = sorted(self.archived)
        return data
