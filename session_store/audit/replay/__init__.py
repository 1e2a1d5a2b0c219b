"""Replay a call's log through today's decide/due code and report where it decides otherwise.

replayer.py: the replay; decisions.py: a log's decisions as it records them (observation and
events); observations.py: how an older log's groups become observations again; report.py:
the report, its redaction, and the Policy a replay runs with.
"""

from .decisions import LoggedDecision, logged_decisions
from .replayer import replay
from .report import (Divergence, ReplayReport, effect_json, event_json, observation_json,
                     parse_policy)

__all__ = ["replay", "LoggedDecision", "logged_decisions", "Divergence", "ReplayReport",
           "effect_json", "event_json", "observation_json", "parse_policy"]
