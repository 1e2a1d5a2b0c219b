"""Which results the model's current state holds (pure): the delivery rules, walked once.

`SessionState.in_model` walks the session's lineage for every call; a state inspector on a
call with thousands of calls and a hundred reconnects asks it thousands of times. These do
the same walk once per state (tests/tools check they agree with the projection).
"""

from __future__ import annotations

from ..projection import SessionState


def lineage_cutoffs(s: SessionState) -> dict[int, int | None]:
    """{generation: cutoff version} whose model state the current session holds.

    The same walk as the projection's `in_model` (current generation, then the generation each
    one resumed from, up to the handle's version), done once for all calls of a state.
    """
    out: dict[int, int | None] = {}
    gen, cutoff = s.generation, None
    while gen and gen not in out:
        out[gen] = cutoff
        info = s.generations.get(gen)
        if info is None or info.parent is None:
            break
        gen, cutoff = info.parent, info.parent_cutoff
    return out


def times_in_model(lineage: dict[int, int | None], call) -> int:
    """How many confirmed sends of `call` the model state holds (I2: at most one)."""
    return sum(1 for x in call.sends if x.confirmed and x.generation in lineage
               and (lineage[x.generation] is None or x.version < lineage[x.generation]))


def effective_sends(s: SessionState, call) -> int:
    return times_in_model(lineage_cutoffs(s), call)
