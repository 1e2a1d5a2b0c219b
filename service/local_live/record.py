"""What the local server records of each connection: its frames, both ways, and its handles.

A :class:`Connection` carries the :class:`~.model_state.ModelState` its session lineage is
in; the rules for that state live in :mod:`.model_state`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import protocol
from .model_state import ModelState, ToolResult


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
    """Everything about one websocket connection, open or closed.

    ``profile`` names the generation whose rules the connection follows (see
    ``profiles.py``). ``notes`` are what the server did that a client cannot see on the wire
    and is not the client's fault: ``{"kind": ..., "detail": ...}`` with kind
    ``context_lost_on_resume``, ``setup_prompt_ignored`` or ``setup_tools_ignored``.
    ``model_output_at`` is when the server first sent model output on it (None: never).
    """

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
    profile: str | None = None
    notes: list[dict[str, Any]] = field(default_factory=list)
    model_output_at: float | None = None

    @property
    def model(self) -> str | None:
        return (self.setup or {}).get("model")

    @property
    def system_instruction(self) -> str | None:
        """The setup's system instruction, text parts joined by newlines (None when absent)."""
        return protocol.instruction_text((self.setup or {}).get("system_instruction"))

    def notes_of(self, kind: str) -> list[dict[str, Any]]:
        return [note for note in self.notes if note["kind"] == kind]

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
            "profile": self.profile,
            "notes": list(self.notes),
            "model_output_at": self.model_output_at,
        }
