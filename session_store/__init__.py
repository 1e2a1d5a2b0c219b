"""session_store: the durable event log of Gemini Live calls, its projection and decisions.

Pure core (events, projection, decide) plus storage; it never imports pipecat.
"""

import importlib

from .decide import decide
from .delivery import choose_resumption, due, seed_history
from .policy import Policy
from .errors import (CallClosed, CannotOpen, ConcurrencyConflict, CorruptEvent, EventDecodeError,
                     Fenced, SchemaMismatch, SchemaVersionTooNew, SessionStoreError,
                     StoreClosed, StoreUnavailable, StreamDamaged, UnknownEventType)
from .events import Event
from .projection import evolve, fold
from .state import CallState, SessionState
from .records import RecordedEvent

# The storage names are imported on first use (PEP 562): a process that only folds and
# decides, or the SQLite writer process (batch planning and sqlite3), does not import
# SQLAlchemy and the drivers (0.35 s).
_LAZY = {"load_state": ".storage.loading", "save_snapshot": ".storage.loading",
         "SqlEventStore": ".storage", "open_store": ".storage",
         "StreamReport": ".audit.verify", "verify_log": ".audit.verify"}


def __getattr__(name: str):
    if name == "__version__":
        # One source of truth: the version pyproject.toml gave the installed distribution.
        from importlib.metadata import PackageNotFoundError, version
        try:
            value = version("durable-gemini-sessions")
        except PackageNotFoundError:  # (a checkout on sys.path that was never installed)
            value = "0+unknown"
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


__all__ = [
    "__version__", "open_store", "SqlEventStore", "RecordedEvent", "Event", "StreamReport",
    "verify_log", "SessionState", "CallState", "evolve", "fold", "load_state", "save_snapshot",
    "Policy", "decide", "due", "choose_resumption", "seed_history",
    "SessionStoreError", "ConcurrencyConflict", "Fenced", "EventDecodeError", "UnknownEventType",
    "SchemaVersionTooNew", "CorruptEvent", "SchemaMismatch", "StoreClosed", "StoreUnavailable",
    "StreamDamaged", "CannotOpen", "CallClosed",
]
