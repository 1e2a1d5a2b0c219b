"""What a model state holds, as pure functions of the call's state (no I/O).

A live session's model state is its own generation's, on top of the state it resumed: its
handle's generation up to that handle, that generation's parent up to the handle it resumed
from, and so on (its *lineage*). A send, a settings change or a conversation message is in a
model state only if it was made, confirmed, within that lineage before the cutoffs. Each
function takes an optional `handle`: then it answers for a session resumed from that handle.
The fold (projection.py), delivery (delivery.py) and compaction all ask these.
"""

from __future__ import annotations

from collections.abc import Iterator

from .state import CallState, Cover, Handle, Send, SessionState

Lineage = dict[int, int | None]  # {generation: cutoff log version, None = up to now}


def walk(state: SessionState, gen: int | None = None,
         cutoff: int | None = None) -> Iterator[tuple[int, int | None]]:
    """(generation, cutoff version) pairs whose model state the current session holds (or,
    from `gen`/`cutoff`, a session resumed from a handle of `gen` at `cutoff`)."""
    if gen is None:
        gen, cutoff = state.generation, None
    seen = set()
    while gen and gen not in seen:
        seen.add(gen)
        yield gen, cutoff
        info = state.generations.get(gen)
        if info is None or info.parent is None:
            return
        gen, cutoff = info.parent, info.parent_cutoff


def lineage_cutoffs(state: SessionState, handle: Handle | None = None) -> Lineage:
    """{generation: cutoff version} whose model state the current session holds (with
    `handle`: a session resumed from it): `walk` once, for asking about many calls (a
    generation appears once in a lineage)."""
    return dict(walk(state, handle.generation, handle.version) if handle else walk(state))


def send_held(lineage: Lineage, send: Send | Cover) -> bool:
    """Does a model state with this lineage hold this send: confirmed, made in one of its
    generations, before that generation's cutoff?"""
    if not send.confirmed or send.generation not in lineage:
        return False
    cutoff = lineage[send.generation]
    return cutoff is None or send.version < cutoff


def result_held(lineage: Lineage, call: CallState) -> bool:
    """Does a model state with this lineage hold the call's result? (A plain loop: `due`
    asks it of every call with an outcome.)"""
    for send in call.sends:
        if send_held(lineage, send):
            return True
    return False


def times_held(lineage: Lineage, call: CallState) -> int:
    """How many confirmed sends of `call` a model state with this lineage holds (I2: at most
    one)."""
    return sum(1 for send in call.sends if send_held(lineage, send))


def in_model(state: SessionState, call: CallState, handle: Handle | None = None) -> bool:
    """Does the current session's model state hold this call's result? With `handle`: would
    a session resumed from that handle hold it?"""
    return result_held(lineage_cutoffs(state, handle), call)


def handle_may_hold(state: SessionState, handle: Handle, send: Send | Cover) -> bool:
    """Could the server state saved in `handle` hold `send`? Only if the send was made in
    that state's lineage before the cutoff: a send in another lineage never is. (Confirmed
    or not: this is asked of the sends whose success is unknown.)"""
    return any(send.generation == gen and (cutoff is None or send.version < cutoff)
               for gen, cutoff in walk(state, handle.generation, handle.version))


def holds_cut_turn(state: SessionState, handle: Handle) -> bool:
    """Whether a session resumed from `handle` would hold a bot turn the caller heard only
    part of, whole: its model state has it from the generation that said it, from anywhere
    after the turn before it (a handle issued mid-turn holds part of it, or all)."""
    cutoffs = lineage_cutoffs(state, handle)
    for before, gen in state.cut_turns:
        if gen in cutoffs:
            cutoff = cutoffs[gen]
            if cutoff is None or cutoff > before:
                return True
    return False


def context_held(state: SessionState, handle: Handle | None = None) -> int:
    """Log version of the last in-session settings change the current model state (with
    `handle`: a session resumed from it) holds."""
    lineage = lineage_cutoffs(state, handle)
    held = 0
    for gen in lineage:
        info = state.generations.get(gen)
        if info is not None:
            held = max(held, info.context_base)
    for send in state.context_sends:
        if send_held(lineage, send):
            held = max(held, send.through)
    return held


def unheld_messages(state: SessionState, handle: Handle | None = None) -> list[int]:
    """Log versions of the conversation messages the current model state (with `handle`: a
    session resumed from it) lacks: neither heard by a session of its lineage before that
    lineage's cutoff, nor covered by a seed or catch-up it holds."""
    if not state.message_marks:
        return []
    lineage = lineage_cutoffs(state, handle)
    covered = max((c.through for c in state.conversation_sends if send_held(lineage, c)),
                  default=0)
    return [v for v, gen in state.message_marks
            if v > covered and not (gen in lineage and ((cut := lineage[gen]) is None
                                                        or v < cut))]


def unheld_calls(state: SessionState, handle: Handle | None = None) -> list[str]:
    """Ids of the tool calls (in request order) whose exchange the current model state (with
    `handle`: a session resumed from it) lacks: asked for outside its lineage or after its
    cutoff, their result not held, and not covered by a seed or catch-up it holds. No handle
    is issued while a blocking call is open, so after a takeover the newest handle predates
    the call the caller just heard announced; resumed from it, the model asks again."""
    if not state.calls:
        return []
    lineage = lineage_cutoffs(state, handle)
    covered = max((c.through for c in state.conversation_sends if send_held(lineage, c)),
                  default=0)
    out = []
    for call in state.calls.values():
        if call.status == "cancelled" or call.superseded_by or call.requested_version <= covered:
            continue
        cutoff = lineage.get(call.generation, 0)
        if call.generation in lineage and (cutoff is None or call.requested_version < cutoff):
            continue
        if result_held(lineage, call):
            continue  # told with its name and id: the model knows it asked
        out.append(call.call_id)
    return out


def unconfirmed_sends(state: SessionState) -> list[tuple[CallState, Send]]:
    """(call, send) for every send of an outcome or intermediate result whose success is
    unconfirmed."""
    return [(c, s) for c in state.calls.values()
            for s in c.sends + [x for p in c.progress for x in p.sends] if not s.confirmed]
