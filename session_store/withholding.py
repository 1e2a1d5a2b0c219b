"""Which resumption handles a session may be resumed from: issued, or withheld.

A handle the server issues right after the client sent content (a seed, a result as content,
a contextUpdate, a NON_BLOCKING call's response) may predate the server's reading of it: it
crosses the send on the wire, so the log would order it after the send although its state
lacks it. Such handles are logged as withheld (ev.HandleWithheld) until the model is seen to
react to what was sent: its first output of a turn begun after the send (a model at rest
reacts only to what it is sent; a turn under way at the send may end first, and a handle may
come in between). A blocking call's response needs none of this: Gemini issues no handle
while such a call is open.

Pure. The gate is part of the call's folded state (`SessionState.withholding`). Its inputs:
two facts the service logs as events (`connection.send_unread` before a send, `holds_all`
for a session that holds everything), and the model output that moves it, an observation
(`ModelOutputObserved`) that `decide` turns into `earlier_turn_ended` or `model_reacted` by
`model_output`. `after` folds them, and a handle arriving is an observation
(`decide.HandleArrived`) decided by `handle_event` on the folded gate. A worker that takes
over, and `replay` (which decides the model output and the handles again), see the gate the
log holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from . import events as ev
from .state import Withholding


@dataclass(frozen=True)
class ModelOutputObserved:
    """A server message of `generation` with model output (`reaction`: audio, a transcript,
    a toolCall, turnComplete) or the end of a turn (`turn_ended`: turnComplete or
    interrupted). An observation (decide.Observation): whether it moves the gate is
    `model_output`, decided on the log. The service hands over only those that do (most
    messages are audio that moves nothing: they must cost no commit)."""
    generation: int
    reaction: bool = False
    turn_ended: bool = False

#: The events the gate folds.
GATE_EVENTS = (ev.SendUnread, ev.EarlierTurnEnded, ev.ModelReacted, ev.HoldsAll)


def after(gate: Withholding, e: ev.Event) -> Withholding:
    """The gate once `e` is logged (any other event leaves it as it is)."""
    match e:
        case ev.SendUnread():
            if gate.unread_send == e.generation:  # a turn under way at either send counts
                turn = gate.turn_at_send or e.turn_under_way
            else:
                turn = e.turn_under_way
            holds = 0 if gate.holds_sends == e.generation else gate.holds_sends
            return Withholding(holds, e.generation, turn)
        case ev.EarlierTurnEnded() if gate.unread_send == e.generation:
            return Withholding(gate.holds_sends, gate.unread_send, False)
        case ev.ModelReacted() if gate.unread_send == e.generation:
            return Withholding(e.generation, 0, False)
        case ev.HoldsAll():
            return Withholding(e.generation, gate.unread_send, gate.turn_at_send)
    return gate


def after_all(gate: Withholding, facts: Iterable[object]) -> Withholding:
    """The gate once `facts` (events and observations among other things, in order) are
    logged: the gate a fact noted now, and not yet committed, is logged against."""
    for fact in facts:
        if isinstance(fact, ModelOutputObserved):
            moved = model_output(gate, fact.generation, reaction=fact.reaction,
                                 turn_ended=fact.turn_ended)
            fact = moved if moved is not None else fact
        if isinstance(fact, GATE_EVENTS):
            gate = after(gate, fact)
    return gate


def model_output(gate: Withholding, generation: int, *, reaction: bool,
                 turn_ended: bool) -> ev.Event | None:
    """The event a server message of `generation` is logged as, if it moves the gate: its
    model output (`reaction`: audio, a transcript, a toolCall, turnComplete; `turn_ended`:
    turnComplete or interrupted) after a send the model was not seen to read. Every other
    message moves nothing and logs nothing (most are audio). decide's rule on a
    ModelOutputObserved, and the service's test of which messages to hand over."""
    if gate.unread_send != generation:
        return None
    if gate.turn_at_send:
        return ev.EarlierTurnEnded(generation) if turn_ended else None
    return ev.ModelReacted(generation) if reaction else None


def handle_event(gate: Withholding, generation: int, handle: str,
                 last_consumed_index: int | None = None
                 ) -> ev.HandleIssued | ev.HandleWithheld:
    """The event that records a handle issued on `generation`: issued if that session holds
    all it was told, else withheld (content went out that the server has not been seen to
    read: it may have issued this handle before, as seen right after setupComplete)."""
    if gate.holds_sends == generation:
        return ev.HandleIssued(generation, handle, last_consumed_index)
    return ev.HandleWithheld(generation, handle)
