"""What a session's setup carries (system instruction, tools) between pipecat and the log.

A change of settings or tools is an observation, decided on the log (session_store.decide:
a contextUpdate where the model takes one, else a new session); `now()` is what a setup or a
contextUpdate would carry at this moment; `declared` is how pipecat declared each tool,
which with the model's rules says whether the server runs a call NON_BLOCKING.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from session_store.decide import SettingsUpdate

from .log_writer import LogWriter, When
from .port import ServicePort
from .translate import as_tools_schema, changed_settings, tool_declarations


class SetupContext:
    """The settings side of one service (pipecat's side: `svc`)."""

    def __init__(self, svc: ServicePort, log: LogWriter):
        self._svc = svc
        self._log = log
        #: The behaviour pipecat's setup declared for each function (`_tag_tool_behaviors`).
        self.declared: dict[str, str] = {}

    def read_declared(self, tools: list) -> None:
        """Read back what pipecat declared: the server runs each call by it (models.call_mode)."""
        for tool in tools:
            for decl in (tool.get("function_declarations") or []) if isinstance(tool, dict) \
                    else []:
                if isinstance(decl, dict) and isinstance(decl.get("name"), str):
                    behavior = decl.get("behavior")
                    if isinstance(behavior, str):
                        self.declared[decl["name"]] = behavior
                    else:
                        self.declared.pop(decl["name"], None)

    async def set_tools(self, tools: Any) -> None:
        """An LLMSetToolsFrame (pipecat ignores it for Gemini Live): logged like a settings
        change."""
        svc = self._svc
        tools = as_tools_schema(tools)
        declarations = tool_declarations(tools)
        if declarations == tool_declarations(svc.pipecat_state.tools_from_init):
            return
        svc.apply(replace(svc.pipecat_state, tools_from_init=tools))
        await self._log.log(SettingsUpdate(("tools",), {"tools": declarations}),
                            when=When.ACTED_ON)

    async def settings_changed(self, changed: dict[str, Any]) -> None:
        """pipecat applied a settings update: applied in-session or by a new session, as the
        log decides."""
        keys = tuple(sorted(changed))
        await self._log.log(SettingsUpdate(keys, changed_settings(self._svc._settings, keys)),
                            when=When.ACTED_ON)

    async def now(self) -> tuple[Any, list]:
        """The system instruction and tools a new session's setup would carry now (pipecat's
        adapter settles them from the context and the service's own)."""
        svc = self._svc
        state = svc.pipecat_state.with_current_prompt()
        svc.apply(state)
        adapter = svc.get_llm_adapter()
        if svc._context is not None:
            params = await adapter.get_llm_invocation_params(
                svc._context, system_instruction=state.system_instruction_from_init,
                service_tools=state.tools_from_init)
            instruction, tools = params["system_instruction"], params["tools"]
        else:
            instruction = state.system_instruction_from_init
            tools = adapter.from_standard_tools(state.tools_from_init)
        tools = list(tools or [])
        if tools and svc._supports_non_blocking_tools:
            svc._tag_tool_behaviors(tools)
        return instruction, tools
