"""A call's timeline: one ordered view of what happened, built from its events (pure).

`build_timeline(records)` turns recorded events (already redacted by the caller) into
entries (one per event: lane, level, a one-line summary), tool calls (request → start →
outcome → sends, with wait and run times, and whether later evidence shows the result in
the model), bot speech, reconnect episodes, takeovers, settings changes, handles and problems.

entries.py: what a timeline holds. kinds.py: how each event type is shown (`KINDS`), with
tool_kinds.py for the tool calls' events.
evidence.py: what a window needs of the rest of the call. draft.py: the timeline being
built, as the summaries see it; builder.py: the builder.
"""

from .builder import (TimelineBuilder, build_timeline, tool_calls_in, unreadable_call,
                      values_from_final)
from .entries import (LANES, LETTING_GO, PLANNED_REASONS, Entry, Reconnect, Send,
                      SpeechSegment, Takeover, Timeline, ToolCallView)
from .evidence import (EPISODE_TYPES, EVIDENCE_TYPES, Evidence, Prior, WholeCall,
                       confirmed_sends)
from .kinds import KINDS, Kind, lane_of

__all__ = ["LANES", "KINDS", "Kind", "lane_of", "build_timeline", "Timeline", "Entry", "Send",
           "ToolCallView", "SpeechSegment", "Reconnect", "Takeover", "Prior", "WholeCall",
           "Evidence", "TimelineBuilder", "EVIDENCE_TYPES", "EPISODE_TYPES", "PLANNED_REASONS",
           "LETTING_GO", "confirmed_sends", "tool_calls_in", "unreadable_call",
           "values_from_final"]
