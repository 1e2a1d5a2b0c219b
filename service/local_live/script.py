"""Declarative scripts: what the local Gemini Live server does on one connection.

A :class:`Script` is a list of steps run in order once ``setupComplete`` has been sent,
plus a few connection-level knobs (delay or refuse the setup, how to answer tool
results once the steps are done). Steps are plain frozen dataclasses; the server
interprets them, so a scenario reads like the conversation it stands for::

    Script([
        Audio(chunks=5),
        ToolCall([Call("c1", "lookup_order", {"id": 1})]),
        WaitToolResponse(["c1"]),
        Audio(chunks=3),
        TurnComplete(),
    ])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union


@dataclass(frozen=True)
class Audio:
    """``chunks`` model-speech chunks (silent PCM, 24 kHz) with ``pause_ms`` between them;
    with ``tone_hz``, a sine at that frequency instead of silence (give each utterance its
    own, and a listener can tell from the audio which utterance it hears, and whether twice)."""

    chunks: int = 1
    chunk_ms: float = 40.0
    pause_ms: float = 0.0
    tone_hz: float | None = None


@dataclass(frozen=True)
class OutputTranscript:
    """What the model said, as ``serverContent.outputTranscription``."""

    text: str


@dataclass(frozen=True)
class InputTranscript:
    """What the user said, as ``serverContent.inputTranscription``."""

    text: str


@dataclass(frozen=True)
class TurnComplete:
    """End of the model's turn. ``generation_complete`` sends that flag first, as Gemini does."""

    generation_complete: bool = False


@dataclass(frozen=True)
class Interrupted:
    """The user barged in: ``serverContent.interrupted``."""


@dataclass(frozen=True)
class Call:
    """One function call the model asks for.

    ``omit`` leaves fields out on the wire (a hostile or Vertex-like server): without
    ``"id"`` the server still tracks the call under ``id`` and takes a result for it by
    function name, as Vertex does; without ``"name"`` the call's function is ``""``.
    """

    id: str
    name: str
    args: Any = field(default_factory=dict)
    omit: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    """A ``toolCall`` message carrying one or several (parallel) function calls."""

    calls: tuple[Call, ...]

    def __init__(self, calls: Call | list[Call] | tuple[Call, ...]) -> None:
        object.__setattr__(self, "calls", (calls,) if isinstance(calls, Call) else tuple(calls))


@dataclass(frozen=True)
class CancelToolCalls:
    """A ``toolCallCancellation``: the calls must not run and need no response."""

    ids: tuple[str, ...]

    def __init__(self, ids: str | list[str] | tuple[str, ...]) -> None:
        object.__setattr__(self, "ids", (ids,) if isinstance(ids, str) else tuple(ids))


@dataclass(frozen=True)
class ResumptionUpdate:
    """A ``sessionResumptionUpdate``.

    ``resumable=None`` follows Gemini's rule: a handle only when no BLOCKING function call
    is outstanding (an open NON_BLOCKING call does not stop one), else ``resumable=false``
    without a handle. ``True`` forces a handle anyway (to test a client against a server
    that breaks the rule); ``False`` never issues one. ``last_consumed`` adds ``lastConsumedClientMessageIndex`` (Vertex only).
    """

    resumable: bool | None = None
    last_consumed: bool = False


@dataclass(frozen=True)
class GoAway:
    """``goAway{timeLeft}``; with ``close_code`` set, the server closes when time is up."""

    time_left: float = 3.0
    close_code: int | None = 1000


@dataclass(frozen=True)
class Usage:
    """A ``usageMetadata`` message."""

    prompt_tokens: int = 10
    response_tokens: int = 20


@dataclass(frozen=True)
class Close:
    """Close the websocket with a code and reason (1000, 1011, 1007, ...)."""

    code: int = 1000
    reason: str = ""


@dataclass(frozen=True)
class Drop:
    """Abort the TCP connection without a close frame, as a network failure does.

    The client sees close code 1006; the record says ``closed_by="abnormal"``.
    """


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Raw:
    """Send this text frame verbatim (malformed JSON, unknown message types, ...)."""

    text: str


@dataclass(frozen=True)
class WaitToolResponse:
    """Wait until the connection's model state holds a result for every id.

    A result counts whether it came as a ``toolResponse`` or as conversation content; as
    content only once a ``clientContent`` with ``turnComplete: true`` has come with it or
    after it (before that Gemini holds it in the context and does not go on).
    On timeout a ``required`` wait records a ``wait_timeout`` violation and ends the
    script; an optional one just moves on.
    """

    ids: tuple[str, ...]
    timeout: float = 5.0
    required: bool = True

    def __init__(
        self, ids: str | list[str] | tuple[str, ...], timeout: float = 5.0, required: bool = True
    ) -> None:
        object.__setattr__(self, "ids", (ids,) if isinstance(ids, str) else tuple(ids))
        object.__setattr__(self, "timeout", timeout)
        object.__setattr__(self, "required", required)


@dataclass(frozen=True)
class WaitIntermediate:
    """Wait until the model state holds ``count`` intermediate results of call ``call_id``.

    Intermediate results are ``toolResponse``s with ``willContinue: true`` on a NON_BLOCKING
    call and progress reports written as content; duplicates do not count. Timeouts behave
    as in :class:`WaitToolResponse`.
    """

    call_id: str
    count: int = 1
    timeout: float = 5.0
    required: bool = True


@dataclass(frozen=True)
class InteractionStatus:
    """A ``serverContent`` holding only ``interactionStatus`` (``"IDLE"``, ``"IN_PROGRESS"``).

    Thinking profiles send these on their own; this step sends one at any point, on any
    profile (to test a client against a server that says something unexpected).
    """

    status: str = "IDLE"


# Kinds :class:`WaitFor` understands: the client message kinds, plus
# "function_result" (any result, by toolResponse or content) and "any".
WAIT_KINDS = (
    "client_content",
    "realtime_input",
    "tool_response",
    "context_update",
    "function_result",
    "any",
)


@dataclass(frozen=True)
class WaitFor:
    """Wait for the next client message of ``kind`` this script has not consumed yet.

    Messages are consumed in arrival order, so one that arrived before the step began
    still counts: a script never misses a message because it was busy sending audio.
    ``where`` narrows the match with a predicate on the normalised message body.
    """

    kind: str
    timeout: float = 5.0
    required: bool = True
    where: Callable[[dict[str, Any]], bool] | None = None

    def __post_init__(self) -> None:
        if self.kind not in WAIT_KINDS:
            raise ValueError(f"WaitFor kind must be one of {WAIT_KINDS}, not {self.kind!r}")


@dataclass(frozen=True)
class WaitSignal:
    """Wait until the test calls ``server.signal(name)``."""

    name: str
    timeout: float = 10.0
    required: bool = True


@dataclass(frozen=True)
class Dynamic:
    """Steps decided when reached: ``plan(connection)`` looks at the connection's record and
    model state (e.g. what a resumed or seeded session already knows) and returns the steps
    to run next. Lets one scenario script survive reconnects and worker crashes."""

    plan: Callable[[Any], Sequence[Any]]


Step = Union[
    Dynamic,
    Audio,
    OutputTranscript,
    InputTranscript,
    TurnComplete,
    Interrupted,
    ToolCall,
    CancelToolCalls,
    ResumptionUpdate,
    GoAway,
    Usage,
    Close,
    Drop,
    Sleep,
    Raw,
    WaitToolResponse,
    WaitIntermediate,
    WaitFor,
    WaitSignal,
    InteractionStatus,
]

DEFAULT_REPLY: tuple[Step, ...] = (Audio(chunks=2), TurnComplete())

# Events that make the server run ``Script.reply`` once the steps are done.
REPLY_TRIGGERS = frozenset({"tool_result", "turn_complete", "realtime_text"})

#: How the server refuses a resumption handle it does not (or no longer) hold: it closes
#: before ``setupComplete`` with a client-error code, the way the Live API closes on a setup
#: it will not take (1007 "Request contains an invalid argument", 1008 "Requested entity was
#: not found" / policy violation). Retrying the same setup cannot succeed. A 1011 (internal
#: error, service unavailable) or a dropped connection says nothing about the handle.
HANDLE_REFUSED = (1008, "Requested entity was not found.")
#: ``refuse_setup`` value for a connection dropped before ``setupComplete`` (no close frame:
#: the client sees 1006, which is never sent on the wire).
DROP_SETUP = 1006


@dataclass(frozen=True)
class Script:
    """What one connection does.

    - ``steps`` run after ``setupComplete``.
    - ``setup_delay`` holds ``setupComplete`` back; ``refuse_setup`` closes with that
      code (and ``refuse_reason``) instead of ever sending it, or, with ``DROP_SETUP``,
      aborts the connection as a network failure does. :meth:`refusing_handle` refuses
      the way the API refuses a resumption handle (``HANDLE_REFUSED``).
    - Once the steps are done, ``reply`` runs each time one of ``reply_on`` happens:
      ``"tool_result"`` when a final result arrives and no BLOCKING call is left open
      (Gemini waits for all parallel results; a result sent as content counts once its
      turn is complete; an intermediate result or one scheduled ``SILENT`` never
      triggers), ``"turn_complete"`` when the client sends ``clientContent`` with
      ``turnComplete: true``, ``"realtime_text"`` when it sends a non-blank
      ``realtimeInput.text`` that carries no function result.
    - ``resumption_after_turn`` sends a rule-following ``sessionResumptionUpdate`` after
      every ``turnComplete`` when the client's setup asked for session resumption, as
      Gemini does (no handle while a BLOCKING call is open).
    """

    steps: tuple[Step, ...] = ()
    setup_delay: float = 0.0
    refuse_setup: int | None = None
    refuse_reason: str = "setup refused by script"
    reply: tuple[Step, ...] = DEFAULT_REPLY
    reply_on: frozenset[str] = frozenset({"tool_result"})
    resumption_after_turn: bool = True

    def __init__(
        self,
        steps: list[Step] | tuple[Step, ...] = (),
        *,
        setup_delay: float = 0.0,
        refuse_setup: int | None = None,
        refuse_reason: str = "setup refused by script",
        reply: list[Step] | tuple[Step, ...] = DEFAULT_REPLY,
        reply_on: set[str] | frozenset[str] = frozenset({"tool_result"}),
        resumption_after_turn: bool = True,
    ) -> None:
        unknown = set(reply_on) - REPLY_TRIGGERS
        if unknown:
            raise ValueError(f"unknown reply triggers {sorted(unknown)}; use {sorted(REPLY_TRIGGERS)}")
        object.__setattr__(self, "steps", tuple(steps))
        object.__setattr__(self, "setup_delay", setup_delay)
        object.__setattr__(self, "refuse_setup", refuse_setup)
        object.__setattr__(self, "refuse_reason", refuse_reason)
        object.__setattr__(self, "reply", tuple(reply))
        object.__setattr__(self, "reply_on", frozenset(reply_on))
        object.__setattr__(self, "resumption_after_turn", resumption_after_turn)

    @classmethod
    def refusing_handle(cls) -> Script:
        """A connection that refuses its setup as the API refuses a resumption handle."""
        code, reason = HANDLE_REFUSED
        return cls(refuse_setup=code, refuse_reason=reason)
