"""What the service's parts (effects, link, receiver, seeding) use of the service itself: a
handful of its own methods, and pipecat's GeminiLiveLLMService state and hooks, which are
private upstream (pinned by tests/service/test_pipecat_contract.py). Typed here so that no
part imports the service class: the service stands above its parts."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from .driver import CallDriver


class ServicePort(Protocol):
    # pipecat's state
    _session: Any
    _connection_task: Any
    _disconnecting: bool
    _settings: Any
    _context: Any
    _system_instruction_from_init: Any
    _base_system_instruction: Any
    _tools_from_init: Any
    _session_resumption_handle: str | None
    _bot_is_responding: bool
    _ready_for_realtime_input: bool
    _run_llm_when_session_ready: bool
    _inference_on_context_initialization: bool
    _consecutive_failures: int

    @property
    def _supports_non_blocking_tools(self) -> bool: ...

    @property
    def _is_gemini_3(self) -> bool: ...

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
    playback: Any  # a playback.PlaybackPosition, or None
    @property
    def driver(self) -> CallDriver: ...

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task: ...

    async def on_fenced(self) -> None: ...
