"""Which results the model's current state holds (pure): the delivery rules, walked once.

`SessionState.in_model` walks the session's lineage for each call it is asked about; a state
inspector on a call with thousands of calls and a hundred reconnects asks about all of them.
These walk it once per state (`SessionState.lineage_cutoffs`) and count with the
projection's own rule (`times_held`), so they cannot disagree with it.
"""

from __future__ import annotations

from ..projection import SessionState, times_held


def effective_sends(s: SessionState, call) -> int:
    """How many confirmed sends of `call` the current model state holds (I2: at most one)."""
    return times_held(s.lineage_cutoffs(), call)
