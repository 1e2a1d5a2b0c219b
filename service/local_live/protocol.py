"""Wire format of Gemini Live (BidiGenerateContent), as google-genai 2.34 speaks it.

Client messages arrive in mixed casing: google-genai writes the top-level keys in
snake_case (``tool_response``, ``client_content``) and most nested keys in camelCase
(``functionResponses``, ``turnComplete``). Everything received is normalised to
snake_case here, except inside fields that hold user data (function args, responses,
JSON schemas), whose keys are the user's and must stay as sent.

Server messages are built in camelCase only: the SDK maps top-level camelCase keys to
its fields and raises ``APIError`` on a message with no key it knows.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

AUDIO_MIME = "audio/pcm;rate=24000"
AUDIO_BYTES_PER_MS = 48  # 24 kHz, 16-bit mono

# Fields whose contents are user data: their keys are never re-cased.
_OPAQUE_FIELDS = frozenset(
    {
        "args",
        "response",
        "parameters",
        "parameters_json_schema",
        "response_json_schema",
        "response_schema",
    }
)

# Top-level keys a client may send, after normalisation, mapped to their kind.
CLIENT_KINDS = ("setup", "client_content", "realtime_input", "tool_response", "context_update")

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])([A-Z])")


def snake(key: str) -> str:
    """``functionResponses`` -> ``function_responses``; snake_case passes through."""
    return _CAMEL_BOUNDARY.sub(r"_\1", key).lower()


def normalise(value: Any) -> Any:
    """Deep copy of a decoded client message with every protocol key in snake_case."""
    if isinstance(value, list):
        return [normalise(item) for item in value]
    if not isinstance(value, dict):
        return value
    result = {}
    for key, item in value.items():
        name = snake(key)
        result[name] = item if name in _OPAQUE_FIELDS else normalise(item)
    return result


def message_kind(message: dict[str, Any]) -> str:
    """The kind of a normalised client message, or ``"unknown"``."""
    kinds = [key for key in message if key in CLIENT_KINDS]
    return kinds[0] if len(kinds) == 1 and len(message) == 1 else "unknown"


def summarise_audio(message: Any) -> Any:
    """Copy of a message with every base64 ``data`` field replaced by its size.

    Recording megabytes of silence makes dumps unreadable; the size is what tests need.
    """
    if isinstance(message, list):
        return [summarise_audio(item) for item in message]
    if not isinstance(message, dict):
        return message
    result = {}
    for key, item in message.items():
        if key == "data" and isinstance(item, str):
            result[key] = f"<{len(item) * 3 // 4 - item.count('=')} bytes>"
        else:
            result[key] = summarise_audio(item)
    return result


# --- server messages -----------------------------------------------------------------


def setup_complete() -> dict[str, Any]:
    return {"setupComplete": {}}


def audio_chunk(duration_ms: float, tone_hz: float | None = None,
                start_sample: int = 0) -> dict[str, Any]:
    """One chunk of model speech of the given duration: silence, or a sine at `tone_hz`
    from sample `start_sample` of its utterance on (so chunks join without a click), which
    a listener can tell apart from every other utterance's tone."""
    size = int(duration_ms * AUDIO_BYTES_PER_MS) & ~1
    if tone_hz is None:
        pcm = bytes(size)
    else:  # (numpy: a fleet of calls speaks 500 chunks a second from one process)
        rate = AUDIO_BYTES_PER_MS * 500  # samples per second
        t = (start_sample + np.arange(size // 2)) / rate
        pcm = (8000 * np.sin(2 * np.pi * tone_hz * t)).astype("<i2").tobytes()
    data = base64.b64encode(pcm).decode("ascii")
    part = {"inlineData": {"mimeType": AUDIO_MIME, "data": data}}
    return {"serverContent": {"modelTurn": {"role": "model", "parts": [part]}}}


def server_content(**fields: Any) -> dict[str, Any]:
    """A ``serverContent`` message; ``fields`` are already camelCase."""
    return {"serverContent": fields}


def tool_call(calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"toolCall": {"functionCalls": calls}}


def tool_call_cancellation(ids: list[str]) -> dict[str, Any]:
    return {"toolCallCancellation": {"ids": list(ids)}}


def resumption_update(
    handle: str | None, resumable: bool, last_consumed: int | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"resumable": resumable}
    if handle is not None:
        body["newHandle"] = handle
    if last_consumed is not None:
        body["lastConsumedClientMessageIndex"] = last_consumed
    return {"sessionResumptionUpdate": body}


def go_away(seconds: float) -> dict[str, Any]:
    """``timeLeft`` is a protobuf Duration in JSON form ("3s"); the SDK keeps the string."""
    return {"goAway": {"timeLeft": f"{seconds:g}s"}}


def usage_metadata(prompt_tokens: int, response_tokens: int) -> dict[str, Any]:
    return {
        "usageMetadata": {
            "promptTokenCount": prompt_tokens,
            "responseTokenCount": response_tokens,
            "totalTokenCount": prompt_tokens + response_tokens,
        }
    }


def usage_only_content(prompt_tokens: int = 0) -> dict[str, Any]:
    """An empty ``serverContent`` carrying only ``usageMetadata`` (Gemini 3.1 after setup)."""
    return {"serverContent": {}, **usage_metadata(prompt_tokens, 0)}


def interaction_status(status: str) -> dict[str, Any]:
    """A ``serverContent`` holding only ``interactionStatus`` (``IDLE``, ``IN_PROGRESS``)."""
    return server_content(interactionStatus=status)


# serverContent fields that are the model's output: the end of "before the first model turn".
MODEL_OUTPUT_FIELDS = ("modelTurn", "outputTranscription")
# serverContent fields that belong to a model turn (thinking models say IN_PROGRESS with them).
TURN_FIELDS = (*MODEL_OUTPUT_FIELDS, "inputTranscription", "generationComplete",
               "turnComplete", "interrupted")


# --- function results and calls inside conversation content ---------------------------


@dataclass(frozen=True)
class ContentResult:
    """A function result found in conversation content (a part or pipecat's text form).

    ``final`` is False for a progress report (an intermediate result written as text).
    """

    name: str
    response: Any
    call_id: str | None
    final: bool = True


# "[Function NAME returned VALUE]" is what pipecat's seed writes; an optional
# "(id X)" / "(call_id X)" after the name lets a sender name the call it answers.
# A name may be empty: a function call the server sent without one is answered as "".
# "[Function NAME (call_id X) reported progress VALUE]" is an intermediate result written as
# text, for a session that does not know the call.
_RESULT_TEXT = re.compile(
    r"\[Function (?P<name>[^\s()\]]*)"
    r"(?: \((?:call[_ ])?id[:= ]\s*(?P<id>[^)\s]+)\))? (?P<verb>returned|reported progress) "
)
_CALL_TEXT = re.compile(r"\[Called function (?P<name>[^\s()\]]*) with args ")


def as_response_dict(value: Any) -> dict[str, Any]:
    """The ``FunctionResponse.response`` shape for a result value, as pipecat builds it.

    Dicts pass through; JSON text decoding to a dict is used as is; anything else is
    wrapped as ``{"value": ...}``. Comparing results in this shape lets a result sent as
    text be recognised as the same result sent earlier as a ``toolResponse``.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {"value": value}
    return value if isinstance(value, dict) else {"value": value}


def comparable(response: Any) -> str:
    """Canonical JSON of a result, ignoring the delivery hint ``scheduling``."""
    if isinstance(response, dict):
        response = {key: item for key, item in response.items() if key != "scheduling"}
    return json.dumps(response, sort_keys=True, default=str)


def content_results(turns: list[Any]) -> list[ContentResult]:
    """Function results carried by conversation turns, in order."""
    found: list[ContentResult] = []
    for part in _parts(turns):
        response = part.get("function_response")
        if isinstance(response, dict):
            found.append(
                ContentResult(
                    name=str(response.get("name", "")),
                    response=as_response_dict(response.get("response", {})),
                    call_id=response.get("id"),
                )
            )
        text = part.get("text")
        if isinstance(text, str):
            found.extend(text_results(text))
    return found


def content_texts(turns: list[Any]) -> list[tuple[str, str]]:
    """(role, text) of every text part that carries no function result, in order."""
    texts = []
    for turn in turns if isinstance(turns, list) else [turns]:
        if not isinstance(turn, dict):
            continue
        role = str(turn.get("role") or "user")
        for part in turn.get("parts") or []:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str) and not _RESULT_TEXT.search(text):
                texts.append((role, text))
    return texts


def declared_behaviors(tools: Any) -> dict[str, str | None]:
    """Function name -> declared ``behavior`` (None when undeclared), from normalised tools."""
    behaviors: dict[str, str | None] = {}
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        for declaration in tool.get("function_declarations") or []:
            if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                behavior = declaration.get("behavior")
                behaviors[declaration["name"]] = str(behavior).upper() if behavior else None
    return behaviors


def instruction_text(instruction: Any) -> str | None:
    """A system instruction's text parts joined by newlines (None when absent)."""
    if instruction is None:
        return None
    if isinstance(instruction, str):
        return instruction
    parts = (instruction.get("parts") if isinstance(instruction, dict) else None) or []
    return "\n".join(part["text"] for part in parts
                     if isinstance(part, dict) and isinstance(part.get("text"), str))


def content_calls(turns: list[Any]) -> list[str]:
    """Names of function calls that conversation turns say the model made, in order."""
    names: list[str] = []
    for part in _parts(turns):
        call = part.get("function_call")
        if isinstance(call, dict):
            names.append(str(call.get("name", "")))
        text = part.get("text")
        if isinstance(text, str):
            names.extend(match["name"] for match in _CALL_TEXT.finditer(text))
    return names


def _parts(turns: list[Any]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for turn in turns if isinstance(turns, list) else [turns]:
        if isinstance(turn, dict):
            parts.extend(part for part in turn.get("parts") or [] if isinstance(part, dict))
    return parts


def text_results(text: str) -> list[ContentResult]:
    """Results and progress reports written in one text, in order."""
    decoder = json.JSONDecoder()
    found = []
    for match in _RESULT_TEXT.finditer(text):
        start = match.end()
        try:
            value, end = decoder.raw_decode(text, start)
            if not text.startswith("]", end):
                raise ValueError("trailing text after the JSON value")
        except ValueError:
            close = text.find("]", start)
            value = text[start:] if close < 0 else text[start:close]
        found.append(ContentResult(match["name"], as_response_dict(value), match["id"],
                                   final=match["verb"] == "returned"))
    return found
