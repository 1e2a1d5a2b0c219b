"""The testing kit: a protocol-faithful, scriptable Gemini Live server for offline tests.

The names below (``__all__``) are the kit's stable API (docs/testing-kit.md); the modules
of this package are its inside. It imports neither pipecat nor google-genai (only
``http_options`` imports google-genai, lazily), so it can run in a process of its own.
"""

from .profiles import PROFILES, Profile, profile_for
from .model_state import ConversationEntry, ModelState, ToolResult
from .record import ClientMessage, Connection, HandleRecord, SentMessage
from .script import (
    DEFAULT_REPLY,
    DROP_SETUP,
    HANDLE_REFUSED,
    Audio,
    Call,
    CancelToolCalls,
    Close,
    Drop,
    Dynamic,
    GoAway,
    InputTranscript,
    InteractionStatus,
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
    WaitIntermediate,
    WaitSignal,
    WaitToolResponse,
)
from .server import LocalLiveServer, ScriptSource, http_options

__all__ = [
    "DEFAULT_REPLY",
    "DROP_SETUP",
    "HANDLE_REFUSED",
    "Audio",
    "Call",
    "CancelToolCalls",
    "ClientMessage",
    "Close",
    "Connection",
    "ConversationEntry",
    "Drop",
    "Dynamic",
    "GoAway",
    "HandleRecord",
    "InputTranscript",
    "InteractionStatus",
    "Interrupted",
    "LocalLiveServer",
    "ModelState",
    "OutputTranscript",
    "PROFILES",
    "Profile",
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
    "WaitIntermediate",
    "WaitSignal",
    "WaitToolResponse",
    "http_options",
    "profile_for",
]
