"""What the local server remembers: per-connection records and the model's state.

The model state is what Gemini "knows" about tool calls on one session lineage: the
calls it issued, the ones it cancelled, and the results it has taken in (and what the
model said, so a test can tell which turns a resumed session remembers). A resumption
handle snapshots it; a connection that resumes with the handle starts from the
snapshot, a fresh connection starts empty. Every result the client sends is judged
against the current state, which is how duplicates and unknown ids are caught.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from . import protocol

# pipecat's name for a result whose call it no longer remembers.
PIPECAT_FALLBACK_NAME = "tool_call_result"


@dataclass(frozen=True)
class ToolResult:
    """One function result as it reached the server.

    ``via`` is ``"tool_response"`` or ``"content"``; ``id`` is the call it answers
    (for content, the call it was attributed to, or None for seeded history);
    ``accepted`` says whether it entered the model state (duplicates, unknown and
    cancelled ids do not).
    """

    connection: int
    id: str | None
    name: str
    response: Any
    via: str
    accepted: bool
    client_message_index: int
    at: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ModelState:
    """Gemini's view of the tool calls on one session lineage."""

    issued: dict[str, str] = field(default_factory=dict)  # call id -> function name
    cancelled: set[str] = field(default_factory=set)
    results: dict[str, ToolResult] = field(default_factory=dict)  # by call id
    history_results: list[ToolResult] = field(default_factory=list)  # seeded, no known call
    history_calls: list[str] = field(default_factory=list)  # seeded call names not yet answered
    anonymous: list[str] = field(default_factory=list)  # issued without an id on the wire
    # The id a client made up for a call issued without one -> the call it answered. That id
    # names the call from then on: without this, the same result sent again under it was
    # taken as the answer of another open call of the function, or (unknown id) accepted
    # as content, so a duplicated result of such a call went unflagged.
    aliases: dict[str, str] = field(default_factory=dict)
    # Calls whose result came as clientContent with turnComplete false: in the context, but
    # Gemini does not act on it until a clientContent with turnComplete true arrives.
    awaiting_turn: set[str] = field(default_factory=set)
    spoken: list[str] = field(default_factory=list)  # what the model said (outputTranscription)

    def outstanding(self) -> list[str]:
        """Issued calls with neither a result nor a cancellation, in issue order."""
        return [
            call_id
            for call_id in self.issued
            if call_id not in self.results and call_id not in self.cancelled
        ]

    def acted_on(self, call_id: str) -> bool:
        """Has the model taken this call's result in and been asked to go on with it?"""
        return call_id in self.results and call_id not in self.awaiting_turn

    def snapshot(self) -> ModelState:
        return copy.deepcopy(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "issued": dict(self.issued),
            "cancelled": sorted(self.cancelled),
            "results": {key: value.to_json() for key, value in self.results.items()},
            "history_results": [result.to_json() for result in self.history_results],
            "history_calls": list(self.history_calls),
            "anonymous": list(self.anonymous),
            "aliases": dict(self.aliases),
            "awaiting_turn": sorted(self.awaiting_turn),
            "spoken": list(self.spoken),
        }


@dataclass(frozen=True)
class Verdict:
    """How a result fits the model state: where it goes and what, if anything, is wrong."""

    call_id: str | None
    accepted: bool
    violation: str | None = None
    detail: str = ""


def judge_tool_response(state: ModelState, call_id: str | None, name: str) -> Verdict:
    """A ``toolResponse`` only makes sense for a call this session issued and left open.

    A call issued without an id takes a result by function name (what Vertex does), whatever
    id the client made up for it: the oldest such call still open with that name. The made-up
    id is remembered (``ModelState.aliases``) and names that call from then on."""
    call_id = state.aliases.get(call_id, call_id) if call_id is not None else None
    if call_id is None or call_id not in state.issued:
        for open_id in state.outstanding():
            if open_id in state.anonymous and state.issued[open_id] == name:
                return Verdict(open_id, True)
    if call_id is None:
        return Verdict(None, False, "unknown_call_id", "toolResponse without an id")
    if call_id in state.results:
        return Verdict(call_id, False, "duplicate_tool_response", f"{name} already answered")
    if call_id in state.cancelled:
        return Verdict(call_id, False, "response_for_cancelled_call", f"{name} was cancelled")
    if call_id not in state.issued:
        return Verdict(
            call_id, False, "unknown_call_id",
            f"{name}: this session never issued the call; Gemini ignores it and stays silent",
        )
    return _check_name(state, call_id, name)


def judge_content_result(state: ModelState, result: protocol.ContentResult) -> Verdict:
    """A result written into the conversation, with or without the id of its call.

    It never answers a call this session issued and still waits for: in the bidi API a
    pending call is answered by a ``toolResponse`` matched by id, content only adds to the
    conversation (google-genai's LiveClientToolResponse). With the id of such a call it is
    flagged ``content_for_pending_call``; without an id it stands as history (the call
    stays open). Otherwise it answers a call the seeded history mentions, or stands alone
    as history. It is a duplicate when the state already holds the same result for that
    function (pipecat re-sends old results under ``tool_call_result``, so that name
    matches any function).
    """
    call_id = result.call_id
    if call_id is not None:
        call_id = state.aliases.get(call_id, call_id)  # a made-up id of an id-less call
        if call_id in state.results:
            return Verdict(call_id, False, "duplicate_tool_response", f"{result.name} already answered")
        if call_id in state.cancelled:
            return Verdict(call_id, False, "response_for_cancelled_call", f"{result.name} was cancelled")
        if call_id in state.issued:
            # Issued here, neither answered nor cancelled: the model waits for a toolResponse.
            # (It was taken as the answer, so results sent as content where a toolResponse
            # was due passed every test while the real model would have stayed blocked.)
            return Verdict(
                call_id, False, "content_for_pending_call",
                f"{result.name}: this session issued {call_id} and waits for a toolResponse; "
                "conversation content does not answer a pending call",
            )
        return Verdict(call_id, True)
    if result.name in state.history_calls:
        return Verdict(None, True)
    wanted = protocol.comparable(result.response)
    for earlier in [*state.results.values(), *state.history_results]:
        same_function = PIPECAT_FALLBACK_NAME in (earlier.name, result.name) or (
            earlier.name == result.name
        )
        if same_function and protocol.comparable(earlier.response) == wanted:
            return Verdict(
                earlier.id, False, "duplicate_tool_response",
                f"{result.name} result already in the conversation",
            )
    return Verdict(None, True)


def admit(state: ModelState, result: ToolResult, client_id: str | None = None) -> None:
    """Put an accepted result into the state; ``client_id`` is the id the client sent."""
    if client_id is not None and result.id is not None and client_id != result.id:
        state.aliases[client_id] = result.id
    if result.name in state.history_calls:
        state.history_calls.remove(result.name)
    if result.id is not None:
        state.results[result.id] = result
    else:
        state.history_results.append(result)


def _check_name(state: ModelState, call_id: str, name: str) -> Verdict:
    expected = state.issued[call_id]
    if name != expected:
        return Verdict(
            call_id, True, "wrong_function_name", f"call {call_id} is {expected}, answered as {name}"
        )
    return Verdict(call_id, True)


@dataclass(frozen=True)
class ClientMessage:
    """A message from the client. ``index`` counts per connection, setup being 0.

    ``body`` is the normalised value under the message's key (the whole message for
    ``unknown``, the raw text for ``malformed``).
    """

    index: int
    kind: str
    body: Any
    at: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SentMessage:
    """A frame the server sent: a message dict, or raw text for :class:`Raw` steps."""

    message: Any
    at: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class HandleRecord:
    """A resumable handle and the model state it restores."""

    handle: str
    connection: int
    state: ModelState
    last_consumed: int
    at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "handle": self.handle,
            "connection": self.connection,
            "state": self.state.to_json(),
            "last_consumed": self.last_consumed,
            "at": self.at,
        }


@dataclass
class Connection:
    """Everything about one websocket connection, open or closed."""

    index: int
    path: str
    opened_at: float
    setup: dict[str, Any] | None = None
    resumed_from: str | None = None
    state: ModelState = field(default_factory=ModelState)
    received: list[ClientMessage] = field(default_factory=list)
    sent: list[SentMessage] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    closed_at: float | None = None
    close_code: int | None = None
    close_reason: str | None = None
    closed_by: str | None = None  # "server", "client" or "abnormal"

    @property
    def model(self) -> str | None:
        return (self.setup or {}).get("model")

    @property
    def system_instruction(self) -> str | None:
        """The system instruction's text parts joined by newlines (None when absent)."""
        instruction = (self.setup or {}).get("system_instruction")
        if instruction is None:
            return None
        if isinstance(instruction, str):
            return instruction
        parts = instruction.get("parts") or []
        return "\n".join(part["text"] for part in parts if isinstance(part.get("text"), str))

    @property
    def tool_names(self) -> list[str]:
        """Names of the function declarations in the setup, in order."""
        names = []
        for tool in (self.setup or {}).get("tools") or []:
            for declaration in tool.get("function_declarations") or []:
                names.append(declaration.get("name"))
        return names

    @property
    def resumption_handle(self) -> str | None:
        """The handle the client asked to resume from, known to the server or not."""
        resumption = (self.setup or {}).get("session_resumption") or {}
        return resumption.get("handle")

    @property
    def wants_resumption(self) -> bool:
        return "session_resumption" in (self.setup or {})

    @property
    def is_open(self) -> bool:
        return self.closed_at is None

    def messages(self, kind: str) -> list[ClientMessage]:
        """Received messages of one kind (``"realtime_input"``, ``"tool_response"``, ...)."""
        return [message for message in self.received if message.kind == kind]

    def sent_kinds(self) -> list[str]:
        """Top-level key of each sent message (``"raw"`` for raw text), in order."""
        return [
            next(iter(sent.message)) if isinstance(sent.message, dict) else "raw"
            for sent in self.sent
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "path": self.path,
            "opened_at": self.opened_at,
            "setup": self.setup,
            "model": self.model,
            "system_instruction": self.system_instruction,
            "tool_names": self.tool_names,
            "resumption_handle": self.resumption_handle,
            "resumed_from": self.resumed_from,
            "state": self.state.to_json(),
            "received": [message.to_json() for message in self.received],
            "sent": [message.to_json() for message in self.sent],
            "results": [result.to_json() for result in self.results],
            "closed_at": self.closed_at,
            "close_code": self.close_code,
            "close_reason": self.close_reason,
            "closed_by": self.closed_by,
        }
