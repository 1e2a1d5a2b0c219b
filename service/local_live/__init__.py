"""A protocol-faithful, scriptable local Gemini Live server for offline tests.

It imports neither pipecat nor google-genai (only ``LocalLiveServer.http_options``
imports google-genai, lazily), so it can run in a harness process of its own.
"""

from .record import ClientMessage, Connection, HandleRecord, ModelState, SentMessage, ToolResult
from .script import (
    DEFAULT_REPLY,
    Audio,
    Call,
    CancelToolCalls,
    Close,
    Drop,
    Dynamic,
    GoAway,
    InputTranscript,
    Interrupted,
    OutputTranscript,
    Raw,
    ResumptionUpdate,
    Script,
    Sleep,
    Step,
    ToolCall,
    TurnComplete,
    Usage,
    WaitFor,
    WaitSignal,
    WaitToolResponse,
)
from .server import LocalLiveServer, ScriptSource, http_options

__all__ = [
    "DEFAULT_REPLY",
    "Audio",
    "Call",
    "CancelToolCalls",
    "ClientMessage",
    "Close",
    "Connection",
    "Drop",
    "Dynamic",
    "GoAway",
    "HandleRecord",
    "InputTranscript",
    "Interrupted",
    "LocalLiveServer",
    "ModelState",
    "OutputTranscript",
    "Raw",
    "ResumptionUpdate",
    "Script",
    "ScriptSource",
    "SentMessage",
    "Sleep",
    "Step",
    "ToolCall",
    "ToolResult",
    "TurnComplete",
    "Usage",
    "WaitFor",
    "WaitSignal",
    "WaitToolResponse",
    "http_options",
]
