"""Read-only queries the CLI and the web viewer share (the only I/O of this package).

Everything is SQLAlchemy Core with bound parameters. listing.py: the call list;
reading.py: one call (windows, states, overview, evidence); following.py: the log as it
grows; fleet.py: fleet stats; base.py: what they share.
"""

from .base import engine_of
from .fleet import fleet_stats
from .following import follow, last_records, log_end
from .listing import (CallPage, call_summary, count_calls, is_planned, list_calls,
                      matching_calls, page_query)
from .reading import (Overview, StateCache, complete_head, evidence_for, iter_records,
                      overview, read_previews, state_at, state_of_read, version_at_time,
                      window_facts)

__all__ = ["engine_of", "fleet_stats", "follow", "last_records", "log_end", "CallPage",
           "call_summary", "count_calls", "is_planned", "list_calls", "matching_calls",
           "page_query",
           "Overview", "StateCache", "complete_head", "evidence_for", "iter_records",
           "overview", "read_previews", "state_at", "state_of_read", "version_at_time",
           "window_facts"]
