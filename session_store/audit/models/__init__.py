"""Every JSON output of the tools, defined once (pydantic models) and published as JSON Schema.

The CLI (`--json`, `export`, `tail --json`) and the web API answer with these and nothing
else, under the same names: `call` is always the call's id (the log's stream id), a tool
call's id is always `tool_call_id`, times are ISO 8601 UTC (`at`, `start`, …) and durations
say their unit (`_ms`, `_s`). `session-store schema NAME` prints a schema; the files under
docs/schemas/ are the same, generated (tests/tools/test_schemas.py keeps them in step).

Values copied from stored events (a generation, an attempt, a tool's arguments) are typed
`Any`: a damaged row is still shown as it is stored, never refused by its own report.

base.py: what they share; calls.py, timeline.py, state.py, checks.py, stats.py: the outputs;
schemas.py: the published names.
"""

from .base import Out, dump, iso_times
from .calls import CallPage, CallSummary
from .checks import Divergence, Replay, VerifiedCall, Verify
from .schemas import SCHEMAS, Error, schema_of
from .state import (ExportLine, State, StateGeneration, StateHandle, StateSend, StateToolCall,
                    Turn)
from .stats import Anomalies, HourCount, Percentiles, Stats, Takeovers
from .timeline import (Attempt, Entry, Evidence, HandleOut, LiveUpdate, Problem, ProgressOut,
                       ReconnectOut, SendOut, SettingOut, Speech, TakeoverOut, Timeline,
                       ToolCall, entry_json, timeline_json)

__all__ = ["Out", "dump", "iso_times", "CallPage", "CallSummary", "Attempt", "Entry", "Evidence",
           "HandleOut", "LiveUpdate", "Problem", "ProgressOut", "ReconnectOut", "SendOut",
           "SettingOut", "Speech", "TakeoverOut", "Timeline", "ToolCall", "entry_json",
           "timeline_json", "ExportLine", "State", "StateGeneration", "StateHandle", "StateSend",
           "StateToolCall", "Turn", "Divergence", "Replay", "VerifiedCall", "Verify", "Anomalies",
           "HourCount", "Percentiles", "Stats", "Takeovers", "Error", "SCHEMAS", "schema_of"]
