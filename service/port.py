"""What the service's parts (effects, link, receiver, seeding) use of the service itself: a
handful of its own methods, and pipecat's GeminiLiveLLMService state and hooks, which are
private upstream (pinned by tests/service/test_pipecat_contract.py). Typed here so that no
part imports the service class: the service stands above its parts.

A part reads pipecat's state through the port and never writes it: it returns what that
state should become (a `PipecatState`), and only the service applies one
(`DurableGeminiLiveLLMService.apply`), so what our code does to pipecat's private attributes
is in one place."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Protocol

from .driver import CallDriver


@dataclasses.dataclass(frozen=True)
class PipecatState:
    """What our parts decide of pipecat's own attributes (each named after the one it sets).
    Read it fresh (`ServicePort.pipecat_state`), `replace` what changes and apply it with
    no await in between: a field left as read is then written back as it is."""

    session: Any
    session_resumption_handle: str | None
    system_instruction_from_init: Any
    base_system_instruction: Any
    tools_from_init: Any
    bot_is_responding: bool
    ready_for_realtime_input: bool
    run_llm_when_session_ready: bool
    #: Of `_settings`: the ones a takeover restores from the log (translate.RESTORED_SETTINGS).
    settings: Mapping[str, Any]

    def with_current_prompt(self) -> PipecatState:
        """A new session, or a contextUpdate, carries the prompt as the settings have it now
        (upstream would send the one it took at construction)."""
        prompt = self.settings.get("system_instruction")
        return self if prompt is None else dataclasses.replace(
            self, system_instruction_from_init=prompt)


class ServicePort(Protocol):
    # pipecat's state, read-only here (written only through `apply`)
    @property
    def _session(self) -> Any: ...

    @property
    def _connection_task(self) -> Any: ...

    @property
    def _disconnecting(self) -> bool: ...

    @property
    def _settings(self) -> Any: ...

    @property
    def _context(self) -> Any: ...

    @property
    def _inference_on_context_initialization(self) -> bool: ...

    @property
    def _supports_non_blocking_tools(self) -> bool: ...

    @property
    def _is_gemini_3(self) -> bool: ...

    @property
    def pipecat_state(self) -> PipecatState: ...

    def apply(self, state: PipecatState) -> None: ...

    # pipecat's hooks and methods
    async def _connect(self, session_resumption_handle: str | None = None) -> None: ...

    async def _disconnect(self) -> None: ...

    async def _handle_connection_error(self, error: Exception) -> bool: ...

    async def _cancel_function_calls_by_tool_call_id(self, tool_call_id: str) -> None: ...

    async def run_function_calls(self, function_calls: Sequence[Any]) -> None: ...

    def has_function(self, function_name: str) -> bool: ...

    def get_llm_adapter(self) -> Any: ...

    def _tag_tool_behaviors(self, tools: list) -> None: ...

    # the service's own
    @property
    def playback(self) -> Any: ...  # a playback.PlaybackPosition, or None

    @property
    def driver(self) -> CallDriver: ...

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task: ...

    async def on_fenced(self) -> None: ...
