"""Support tooling's logic: timelines, call summaries, export with redaction, replay.

Pure functions over recorded events and projected states, plus `queries` (read-only SQL
shared by the CLI and the web viewer). The CLI (`session_store.commands.cli`) and the web viewer
(`session_store.web`) only parse input and present what these return.
"""

from .export import EXPORT_SCHEMA, export_line, state_view
from .redaction import MASK, RedactionConfig, Redactor, load_config
from .replay import ReplayReport, parse_policy, replay
from .summaries import STATUSES, CallFilter, CallSummary, parse_time
from .timeline import LANES, Timeline, build_timeline, lane_of

__all__ = [
    "EXPORT_SCHEMA", "export_line", "state_view", "MASK", "RedactionConfig", "Redactor",
    "load_config", "ReplayReport", "parse_policy", "replay", "STATUSES", "CallFilter",
    "CallSummary", "parse_time", "LANES", "Timeline", "build_timeline", "lane_of",
]
