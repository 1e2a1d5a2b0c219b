"""pipecat's settings and tools as the log keeps them, and back (plain JSON, secrets masked)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import TYPE_CHECKING, Any

import pydantic
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema

from session_store.storable import Unstorable, preview

from .redaction import redact_settings

if TYPE_CHECKING:
    from .port import PipecatState

# Settings restored from the log on takeover (plain strings; secrets were never logged). The
# model too: a call keeps its model (its handles are that model's, and the log's decisions
# follow its generation's rules); a worker's own model applies to the calls it opens.
RESTORED_SETTINGS = ("model", "system_instruction", "voice", "language")
#: The settings a new call logs when it opens (its SessionOpened).
SNAPSHOT_SETTINGS = ("model", "system_instruction", "voice", "language", "modalities")


def jsonable(value: Any) -> Any:
    """A tool result or arguments as plain JSON (what the log stores and the model is told)."""
    return json.loads(json.dumps(value, default=str))


def value_of(result: Any) -> Any:
    """A tool's value (a result, an outcome check's `Done`) as JSON, or what stands for one that cannot be made JSON (a cycle,
    nesting too deep): whether the log can store it is decided on the log."""
    try:
        return jsonable(result)
    except (TypeError, ValueError, RecursionError) as exc:
        return Unstorable(f"{type(exc).__name__}: {exc}"[:200], preview(result))


def settings_snapshot(settings: Any) -> dict[str, Any]:
    values = {}
    for key in SNAPSHOT_SETTINGS:
        value = getattr(settings, key, None)
        if value is not None and type(value).__name__ != "NotGiven":
            values[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
    return redact_settings(values)


def changed_settings(settings: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """The values of `keys` as the log keeps them. A key pipecat did not recognise lives in
    `extra` (its value was logged as null)."""
    extra = getattr(settings, "extra", None) or {}
    return redact_settings({k: plain(extra[k] if k in extra else getattr(settings, k, None))
                            for k in keys})


def tool_names(tools: Any) -> list[str]:
    standard = getattr(tools, "standard_tools", None) or []
    return sorted(getattr(t, "name", str(t)) for t in standard)


def tool_declarations(tools: Any) -> list[dict]:
    """The standard tools as plain declarations (what the log keeps of a tools change)."""
    standard = getattr(tools, "standard_tools", None) or []
    return [plain(t.to_default_dict()) for t in standard if isinstance(t, FunctionSchema)]


def as_tools_schema(tools: Any) -> ToolsSchema:
    if isinstance(tools, ToolsSchema):
        return tools
    return ToolsSchema(standard_tools=[t for t in (tools or []) if isinstance(t, FunctionSchema)])


def tools_from_declarations(declarations: list) -> ToolsSchema:
    """The tools a log's declarations describe (the inverse of `tool_declarations`)."""
    schemas = []
    for d in declarations:
        if isinstance(d, dict) and isinstance(d.get("name"), str):
            params = d["parameters"] if isinstance(d.get("parameters"), dict) else {}
            schemas.append(FunctionSchema(name=d["name"], description=d.get("description") or "",
                                          properties=params.get("properties") or {},
                                          required=params.get("required") or []))
    return ToolsSchema(standard_tools=schemas)


def restored(state: PipecatState, logged: dict[str, Any]) -> PipecatState:
    """A takeover continues with the settings the log says are current, not the ones the
    service was constructed with (the app may have changed the prompt before the crash):
    pipecat's own attributes as its constructor would have set them (`state` as
    constructed), for the service to apply."""
    composed = state.settings.get("system_instruction")  # as constructed (pipecat's addons)
    settings = dict(state.settings)
    for key in RESTORED_SETTINGS:
        if isinstance(logged.get(key), str):
            settings[key] = logged[key]
    changes: dict[str, Any] = {"settings": settings}
    tools = logged.get("tools")
    if isinstance(tools, list) and tools != tool_declarations(state.tools_from_init):
        # The app changed the tools before the crash (LLMSetToolsFrame): the log keeps
        # their declarations (the handlers are the app's own, registered by name).
        changes["tools_from_init"] = tools_from_declarations(tools)
    prompt = logged.get("system_instruction")
    if isinstance(prompt, str):
        changes["system_instruction_from_init"] = prompt
        if prompt != composed:
            # pipecat rebuilds `_settings.system_instruction` from the base prompt it took
            # at construction (`_compose_system_instruction`, on the first context's tool
            # sync): without this the constructed prompt came back there, and the first
            # reconnect after a takeover sent it (tests/service/test_takeover_seed.py).
            changes["base_system_instruction"] = base_prompt(prompt, composed,
                                                             state.base_system_instruction)
    return dataclasses.replace(state, **changes)


def base_prompt(prompt: str, composed: Any, base: Any) -> str:
    """The base of a logged prompt. The log holds the prompt as pipecat composed it (its base
    followed by the addons it appends: an app's appended instructions, tool guidance); its
    base is what pipecat must compose from again, or the addons would go in twice."""
    if isinstance(composed, str) and isinstance(base, str) and composed.startswith(base):
        addons = composed[len(base):]
        if addons and prompt.endswith(addons):
            return prompt[:len(prompt) - len(addons)]
    return prompt


def plain(value: Any) -> Any:
    """A setting as plain JSON. Mappings, lists and models stay structured, so that
    redact_settings can still mask a secret nested in them by its key: str() of a dict, or
    of a pydantic model such as google-genai's HttpOptions, hides the key from it and logs
    the secret (seen: an api key header). An object of any other kind is logged by its type
    only, as its text may hold anything."""
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if type(value).__name__ == "NotGiven":
        return None
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, pydantic.BaseModel):
        return plain(value.model_dump(mode="json", exclude_none=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    return f"<{type(value).__name__}>"
