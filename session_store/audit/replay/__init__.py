"""Replay a call's log through today's decide/due code and report where it decides otherwise.

replayer.py: the replay (and how each logged group becomes an observation again);
report.py: the report, its redaction, and the Policy a replay runs with.
"""

from .replayer import replay
from .report import (Divergence, ReplayReport, effect_json, event_json, observation_json,
                     parse_policy)

__all__ = ["replay", "Divergence", "ReplayReport", "effect_json", "event_json",
           "observation_json", "parse_policy"]
