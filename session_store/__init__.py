"""session_store: the durable event log of Gemini Live calls, its projection and decisions.

Pure core (events, projection, decide) plus storage; it never imports pipecat.
"""

import importlib

from .decide import Policy, choose_resumption, decide, due, seed_history
from .errors import (CallClosed, CannotOpen, ConcurrencyConflict, CorruptEvent, EventDecodeError,
                     Fenced, SchemaMismatch, SchemaVersionTooNew, SessionStoreError,
                     StoreClosed, StoreUnavailable, StreamDamaged, UnknownEventType)
from .events import Event
from .projection import CallState, SessionState, evolve, fold
from .records import RecordedEvent

# The storage names are imported on first use (PEP 562): a process that only folds and
# decides, or the SQLite writer process (batch planning and sqlite3), does not import
# SQLAlchemy and the drivers (0.35 s).
_LAZY = {"load_state": ".loading", "save_snapshot": ".loading", "SqlEventStore": ".storage",
         "StreamReport": ".storage", "open_store": ".storage"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


__all__ = [
    "open_store", "SqlEventStore", "RecordedEvent", "Event", "StreamReport",
    "SessionState", "CallState", "evolve", "fold", "load_state", "save_snapshot",
    "Policy", "decide", "due", "choose_resumption", "seed_history",
    "SessionStoreError", "ConcurrencyConflict", "Fenced", "EventDecodeError", "UnknownEventType",
    "SchemaVersionTooNew", "CorruptEvent", "SchemaMismatch", "StoreClosed", "StoreUnavailable",
    "StreamDamaged", "CannotOpen", "CallClosed",
]
