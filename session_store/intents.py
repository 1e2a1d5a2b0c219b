"""What the log records for an effect `due` decided, before the shell performs it.

A commit decides once: its events are folded in, `due(state)` is asked, and the intent of
each effect the caller acts on goes into that same append (write-ahead: the shell performs an
effect only once its intent is logged). Settling a call left in doubt is logged outright:
its failure is the effect. A reconnect has no intent: the new session's events record it.
"""

from __future__ import annotations

from . import events as ev
from .cut_notes import CUT_TURN
from .delivery import (OUTCOME_UNKNOWN, ApplyContext, Effect, Reconnect, ResolveInDoubt,
                       SendConversation, SendResult, StartCall, TellCut)
from .state import SessionState

#: Effects that go out on the live session: their intents are logged only when it can carry
#: them at the moment of the commit.
SENDS: frozenset[type] = frozenset({ApplyContext, SendConversation, SendResult, TellCut})
#: Effects whose intent the log records (all but a reconnect).
LOGGED: frozenset[type] = frozenset({ResolveInDoubt, StartCall}) | SENDS
#: Every kind of effect.
ALL: frozenset[type] = LOGGED | {Reconnect}


def intents(state: SessionState, effects: list[Effect], kinds: frozenset[type],
            epoch: int) -> list[ev.Event]:
    """The events that log the effects of `kinds`, in the order `due` gave them, for the
    worker of fencing epoch `epoch` on the session `state` is connected to. A send `due`
    puts before them that is not of `kinds` holds the later sends back (they are logged by
    the drain that logs it): the model reads what goes out in order, and a result it read
    before the turns a resumed session lacks made it say those turns again."""
    out: list[ev.Event] = []
    held = False
    for effect in effects:
        if type(effect) not in kinds:
            held = held or type(effect) in SENDS
            continue
        if held and type(effect) in SENDS:
            continue
        match effect:
            case ResolveInDoubt():
                out.append(ev.ToolCallFailed(effect.call_id, OUTCOME_UNKNOWN,
                                             outcome_unknown=True))
            case StartCall():
                out.append(ev.ToolCallStarted(effect.call_id, effect.attempt,
                                              effect.idempotency_key, epoch))
            case SendResult():
                out.append(ev.ToolResultSending(effect.call_id, state.generation, effect.via,
                                                effect.part))
            case ApplyContext():
                out.append(ev.ContextSending(state.generation, effect.version))
            case SendConversation():
                out.append(ev.ConversationSending(state.generation, effect.through, "content"))
            case TellCut(via="reseed"):  # told by replacing the session (cut_notes.py)
                out.append(ev.CutTelling(state.generation, effect.cut, effect.via))
                if state.reconnect_pending is None:  # (one pending replaces it as well)
                    out.append(ev.ReconnectRequested(CUT_TURN))
            case TellCut():
                out.append(ev.CutTelling(state.generation, effect.cut, effect.via))
    return out
