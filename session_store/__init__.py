"""session_store: the durable event log of Gemini Live calls, its projection and decisions.

Pure core (events, projection, decide) plus storage; it never imports pipecat.
"""

from .decide import Policy, choose_resumption, decide, due, seed_history
from .errors import (ConcurrencyConflict, CorruptEvent, EventDecodeError, Fenced,
                     SchemaMismatch, SchemaVersionTooNew, SessionStoreError, StoreClosed,
                     StoreUnavailable, StreamDamaged, UnknownEventType)
from .events import Event
from .loading import load_state, save_snapshot
from .projection import CallState, SessionState, evolve, fold
from .records import RecordedEvent
from .storage import SqlEventStore, StreamReport, open_store

__all__ = [
    "open_store", "SqlEventStore", "RecordedEvent", "Event", "StreamReport",
    "SessionState", "CallState", "evolve", "fold", "load_state", "save_snapshot",
    "Policy", "decide", "due", "choose_resumption", "seed_history",
    "SessionStoreError", "ConcurrencyConflict", "Fenced", "EventDecodeError", "UnknownEventType",
    "SchemaVersionTooNew", "CorruptEvent", "SchemaMismatch", "StoreClosed", "StoreUnavailable",
    "StreamDamaged",
]
