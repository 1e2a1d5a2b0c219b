"""What the model knows on one session lineage, and how a result is judged against it.

The model state holds the calls Gemini issued (and in which mode), the ones it cancelled,
the results it has taken in (final and intermediate), the conversation it heard and said,
and its current system instruction and tools. A resumption handle snapshots it; a
connection that resumes with the handle starts from the snapshot, a fresh connection
starts from its setup. Every result the client sends is judged against the current
state, which is how duplicates and unknown ids are caught.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import protocol
from .profiles import BLOCKING

# pipecat's name for a result whose call it no longer remembers.
PIPECAT_FALLBACK_NAME = "tool_call_result"


@dataclass(frozen=True)
class ToolResult:
    """One function result as it reached the server.

    ``via`` is ``"tool_response"``, ``"content"`` (``clientContent``) or ``"realtime"``
    (``realtimeInput.text``); ``id`` is the call it answers (for content, the call it was
    attributed to, or None for seeded history); ``accepted`` says whether it entered the
    model state (duplicates, unknown and cancelled ids do not). ``final`` is False for an
    intermediate result (``willContinue: true`` on a NON_BLOCKING call, or a progress report
    written as content); ``will_continue`` and ``scheduling`` are the ``FunctionResponse``
    fields as sent (None when absent; ``scheduling`` falls back to the one pipecat also puts
    inside ``response``).
    """

    connection: int
    id: str | None
    name: str
    response: Any
    via: str
    accepted: bool
    client_message_index: int
    at: float
    final: bool = True
    will_continue: bool | None = None
    scheduling: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ConversationEntry(NamedTuple):
    """One thing said in the conversation the model holds.

    ``how``: ``"heard"`` (an input transcription the server sent: the user spoke),
    ``"spoken"`` (an output transcription: the model spoke), ``"content"`` (a
    ``clientContent`` text that is not a function result, seeds included) or ``"realtime"``
    (a ``realtimeInput.text`` that is not a function result).
    """

    role: str
    text: str
    how: str


@dataclass
class ModelState:
    """Gemini's view of one session lineage."""

    issued: dict[str, str] = field(default_factory=dict)  # call id -> function name
    modes: dict[str, str] = field(default_factory=dict)  # call id -> BLOCKING / NON_BLOCKING
    cancelled: set[str] = field(default_factory=set)
    results: dict[str, ToolResult] = field(default_factory=dict)  # final results, by call id
    intermediates: dict[str, list[ToolResult]] = field(default_factory=dict)  # by call id
    history_results: list[ToolResult] = field(default_factory=list)  # seeded, no known call
    history_intermediates: list[ToolResult] = field(default_factory=list)  # progress, no id
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
    conversation: list[ConversationEntry] = field(default_factory=list)
    system_instruction: str | None = None
    tools: dict[str, str | None] = field(default_factory=dict)  # function -> declared behavior
    context_updates: list[dict[str, Any]] = field(default_factory=list)  # applied, in order

    @property
    def tool_names(self) -> list[str]:
        return list(self.tools)

    def mode_of(self, call_id: str) -> str:
        return self.modes.get(call_id, BLOCKING)

    def outstanding(self) -> list[str]:
        """Open calls: issued with neither a final result nor a cancellation, in issue order."""
        return [
            call_id
            for call_id in self.issued
            if call_id not in self.results and call_id not in self.cancelled
        ]

    def blocking_outstanding(self) -> list[str]:
        """Open BLOCKING calls: while one is open the model waits (and issues no handle)."""
        return [call_id for call_id in self.outstanding() if self.mode_of(call_id) == BLOCKING]

    def is_closed(self, call_id: str) -> bool:
        """Has the call had its final result or been cancelled?"""
        return call_id in self.results or call_id in self.cancelled

    def acted_on(self, call_id: str) -> bool:
        """Has the model taken this call's final result in and been asked to go on with it?"""
        return call_id in self.results and call_id not in self.awaiting_turn

    def answered_names(self) -> set[str]:
        """The functions whose result this state holds: answered, or seeded as history."""
        names = {self.issued.get(call_id, r.name) for call_id, r in self.results.items()}
        return names | {r.name for r in self.history_results}

    def snapshot(self) -> ModelState:
        return copy.deepcopy(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "issued": dict(self.issued),
            "modes": dict(self.modes),
            "cancelled": sorted(self.cancelled),
            "closed": sorted(set(self.results) | self.cancelled),
            "results": {key: value.to_json() for key, value in self.results.items()},
            "intermediates": {
                key: [result.to_json() for result in values]
                for key, values in self.intermediates.items()
            },
            "history_results": [result.to_json() for result in self.history_results],
            "history_intermediates": [result.to_json() for result in self.history_intermediates],
            "history_calls": list(self.history_calls),
            "anonymous": list(self.anonymous),
            "aliases": dict(self.aliases),
            "awaiting_turn": sorted(self.awaiting_turn),
            "spoken": list(self.spoken),
            "conversation": [entry._asdict() for entry in self.conversation],
            "system_instruction": self.system_instruction,
            "tool_names": self.tool_names,
            "tools": dict(self.tools),
            "context_updates": list(self.context_updates),
        }


@dataclass(frozen=True)
class Verdict:
    """How a result fits the model state: where it goes, whether it closes its call, and what,
    if anything, is wrong with it (``violations``: (kind, detail) pairs, in order)."""

    call_id: str | None
    accepted: bool
    violations: tuple[tuple[str, str], ...] = ()
    final: bool = True


def judge_tool_response(
    state: ModelState, call_id: str | None, name: str, will_continue: bool | None = None,
    response: Any = None,
) -> Verdict:
    """A ``toolResponse`` only makes sense for a call this session issued and left open.

    A call issued without an id takes a result by function name (what Vertex does), whatever
    id the client made up for it: the oldest such call still open with that name. The made-up
    id is remembered (``ModelState.aliases``) and names that call from then on.

    On a NON_BLOCKING call ``will_continue`` True makes the response intermediate (the call
    stays open), False final; unset is flagged and taken as final. On a BLOCKING call the
    field is ignored (flagged when True): every response is final.
    """
    call_id = state.aliases.get(call_id, call_id) if call_id is not None else None
    if call_id is None or call_id not in state.issued:
        for open_id in state.outstanding():
            if open_id in state.anonymous and state.issued[open_id] == name:
                call_id = open_id
                break
    if call_id is None:
        return Verdict(None, False, (("unknown_call_id", "toolResponse without an id"),))
    flags: list[tuple[str, str]] = []
    final = will_continue is not True
    if call_id in state.issued:
        if state.mode_of(call_id) == BLOCKING:
            final = True
            if will_continue:
                flags.append(("will_continue_on_blocking_call",
                              f"{name}: willContinue is for NON_BLOCKING calls; "
                              "Gemini ignores it and takes this as the final result"))
        elif will_continue is None:
            flags.append(("will_continue_unset",
                          f"{name} is NON_BLOCKING: its response must say willContinue "
                          "(true: more will follow, false: this closes the call); "
                          "taken as closing"))
    if call_id in state.results:
        if final:
            flags.append(("duplicate_tool_response", f"{name} already answered"))
        else:
            flags.append(("response_after_close",
                          f"{name}: the call was closed; future responses are not considered"))
        return Verdict(call_id, False, tuple(flags), final)
    if call_id in state.cancelled:
        flags.append(("response_for_cancelled_call", f"{name} was cancelled"))
        return Verdict(call_id, False, tuple(flags), final)
    if call_id not in state.issued:
        flags.append((
            "unknown_call_id",
            f"{name}: this session never issued the call; Gemini ignores it and stays silent",
        ))
        return Verdict(call_id, False, tuple(flags), final)
    return _finish(state, call_id, name, final, flags, response=response)


def judge_content_result(state: ModelState, result: protocol.ContentResult) -> Verdict:
    """A result (or a progress report) written into the conversation, with or without the id
    of its call.

    It never answers a call this session issued and still waits for: in the bidi API a
    pending call is answered by a ``toolResponse`` matched by id, content only adds to the
    conversation (google-genai's LiveClientToolResponse). With the id of such a call it is
    flagged ``content_for_pending_call``; without an id it stands as history (the call
    stays open). Otherwise it answers a call the seeded history mentions, or stands alone
    as history. It is a duplicate when the state already holds the same result for that
    function (pipecat re-sends old results under ``tool_call_result``, so that name
    matches any function). A progress report is a duplicate of an equal earlier
    intermediate of the same call, and comes too late once the call is closed.
    """
    call_id = result.call_id
    final = result.final
    if call_id is not None:
        call_id = state.aliases.get(call_id, call_id)  # a made-up id of an id-less call
        if call_id in state.results:
            if final:
                return _refused(call_id, "duplicate_tool_response", f"{result.name} already answered")
            return _refused(call_id, "response_after_close",
                            f"{result.name}: the call was closed; progress comes too late", final)
        if call_id in state.cancelled:
            return _refused(call_id, "response_for_cancelled_call",
                            f"{result.name} was cancelled", final)
        if call_id in state.issued:
            # Issued here, neither answered nor cancelled: the model waits for a toolResponse.
            # (It was taken as the answer, so results sent as content where a toolResponse
            # was due passed every test while the real model would have stayed blocked.)
            return _refused(
                call_id, "content_for_pending_call",
                f"{result.name}: this session issued {call_id} and waits for a toolResponse; "
                "conversation content does not answer a pending call", final,
            )
        if not final:
            return _finish(state, call_id, result.name, final, [], check_name=False,
                           response=result.response)
        return Verdict(call_id, True)
    wanted = protocol.comparable(result.response)
    if not final:
        for earlier in state.history_intermediates:
            if earlier.name == result.name and protocol.comparable(earlier.response) == wanted:
                return _refused(None, "duplicate_intermediate",
                                f"{result.name} progress already in the conversation", final)
        return Verdict(None, True, (), final)
    if result.name in state.history_calls:
        return Verdict(None, True)
    for earlier in [*state.results.values(), *state.history_results]:
        same_function = PIPECAT_FALLBACK_NAME in (earlier.name, result.name) or (
            earlier.name == result.name
        )
        if same_function and protocol.comparable(earlier.response) == wanted:
            return _refused(earlier.id, "duplicate_tool_response",
                            f"{result.name} result already in the conversation")
    return Verdict(None, True)


def admit(state: ModelState, result: ToolResult, client_id: str | None = None) -> None:
    """Put an accepted result into the state; ``client_id`` is the id the client sent."""
    if client_id is not None and result.id is not None and client_id != result.id:
        state.aliases[client_id] = result.id
    if not result.final:
        if result.id is not None:
            state.intermediates.setdefault(result.id, []).append(result)
        else:
            state.history_intermediates.append(result)
        return
    if result.name in state.history_calls:
        state.history_calls.remove(result.name)
    if result.id is not None:
        state.results[result.id] = result
    else:
        state.history_results.append(result)


def _refused(call_id: str | None, kind: str, detail: str, final: bool = True) -> Verdict:
    return Verdict(call_id, False, ((kind, detail),), final)


def _finish(
    state: ModelState, call_id: str, name: str, final: bool, flags: list[tuple[str, str]],
    *, check_name: bool = True, response: Any = None,
) -> Verdict:
    """The checks left for a result of an open (or, as content, unknown) call."""
    if not final and response is not None:
        wanted = protocol.comparable(response)
        for earlier in state.intermediates.get(call_id, []):
            if protocol.comparable(earlier.response) == wanted:
                flags.append(("duplicate_intermediate",
                              f"{name}: the same intermediate result was already taken in"))
                return Verdict(call_id, False, tuple(flags), final)
    if check_name and name != state.issued[call_id]:
        flags.append(("wrong_function_name",
                      f"call {call_id} is {state.issued[call_id]}, answered as {name}"))
    return Verdict(call_id, True, tuple(flags), final)
