"""Compaction: what a snapshot stores, the decision state bounded however long the call.

`compact(state)` leaves out what no decision can need again — calls settled for good
(archived by id only), handles that can never be chosen, generations outside every lineage
still reachable — and the conversation, which only seeding a fresh session needs: a
compacted state says so (`history_complete = False`), and whoever needs the history
(seeding) loads the whole log (`HistoryNeeded`). Decisions on a compacted state equal those
on the full fold (tests/core/test_compaction.py; through a store:
tests/store/contract/test_compaction.py).
"""

from __future__ import annotations

import copy

from .lineage import handle_may_hold, in_model, unconfirmed_sends, unheld_messages, walk
from .policy import CROSSING_WINDOW_US, HANDLE_TTL_US
from .state import CallState, Generation, SessionState


def compact(state: SessionState, *, handle_ttl_us: int = HANDLE_TTL_US,
            crossing_window_us: int = CROSSING_WINDOW_US) -> SessionState:
    """The decision state of `state`, bounded: what a snapshot stores (see the module doc).

    Pure; `state` is not modified (the result shares nothing mutable with it once
    serialised: callers serialise it at once). Time is the state's own (its last event), so
    the same state always compacts the same way. Options must be at least the policy's."""
    now = state.last_event_at_us
    # Handles a future session may still resume from (delivery.choose_resumption): among the
    # unexpired, unrefused ones that provably lack every unconfirmed send, only the newest can
    # ever be chosen (a later send is never in an existing handle's state); newer ones are
    # kept too, as they become eligible once their unconfirmed sends are confirmed.
    live = [h for h in state.handles.values() if now - h.issued_at_us <= handle_ttl_us]
    unconfirmed = [s for _c, s in unconfirmed_sends(state)]
    eligible = [h for h in live if not h.refused
                and not any(handle_may_hold(state, h, s) for s in unconfirmed)]
    floor = max((h.version for h in eligible), default=0)
    handles = {h.handle: h for h in live if h.version >= floor}
    calls = {cid: c for cid, c in state.calls.items()
             if not _settled_for_good(state, c, handles.values(), now, crossing_window_us)}
    # Conversation messages every state a session can still resume holds need no mark.
    unheld = set(unheld_messages(state))
    for h in handles.values():
        unheld.update(unheld_messages(state, h))
    marks = [m for m in state.message_marks if m[0] in unheld]
    # Covers are kept whole: one per reconnect or prompt change, and which of them a kept
    # handle's state holds depends on its cutoff.
    context_sends, conversation_sends = state.context_sends, state.conversation_sends
    # Generations on a lineage a session can still hold (the current one's, every kept
    # handle's), down to the oldest one a kept call, mark or cover was asked, heard or sent
    # in: the lineage walks of decisions only ever look for those (generations grow along a
    # lineage).
    oldest = min([state.generation] + [h.generation for h in handles.values()]
                 + [g for c in calls.values() for g in [c.generation]
                    + [s.generation for s in c.sends]
                    + [s.generation for p in c.progress for s in p.sends]]
                 + [g for _v, g in marks]
                 + [c.generation for c in context_sends + conversation_sends])
    generations: dict[int, Generation] = {}
    for start in [None] + list(handles.values()):
        lineage = walk(state, start.generation, start.version) if start else walk(state)
        for gen, _cutoff in lineage:
            if gen < oldest:
                break
            if gen in state.generations:
                generations[gen] = state.generations[gen]
    compacted = copy.copy(state)
    compacted.handles, compacted.generations, compacted.calls = handles, generations, calls
    compacted.message_marks = marks
    compacted.cut_turns = list(state.cut_turns)
    compacted.cut_notes = copy.deepcopy(state.cut_notes)  # (bounded: owed to one session)
    compacted.context_sends = copy.deepcopy(context_sends)
    compacted.conversation_sends = copy.deepcopy(conversation_sends)
    compacted.archived = state.archived | (state.calls.keys() - calls.keys())
    compacted.conversation, compacted.history_complete = [], False
    kept = [handle_ttl_us, crossing_window_us]
    compacted.compacted_with = (kept if state.compacted_with is None
                                else [min(a, b) for a, b in zip(kept, state.compacted_with)])
    compacted.settings, compacted.tools = dict(state.settings), list(state.tools)
    compacted.reconnect_keys = list(state.reconnect_keys)
    return compacted


def _settled_for_good(state: SessionState, c: CallState, handles, now: int,
                      crossing_window_us: int) -> bool:
    """No decision can involve `c` again: it is cancelled or its outcome is in the model of
    the current session and of every session a kept handle could resume (any later session
    descends from one of those, or is fresh and loads the whole history), every send of it
    is confirmed, it is past the crossing window, and no re-issue links it to another call."""
    sends = c.sends + [s for p in c.progress for s in p.sends]
    if c.reissue_of or c.superseded_by or any(not s.confirmed for s in sends):
        return False
    last = max([c.requested_at_us, c.finished_at_us or 0] + [s.at_us for s in sends])
    if now - last <= crossing_window_us:
        return False
    if c.status == "cancelled":
        return True
    return (c.has_outcome and in_model(state, c)
            and all(in_model(state, c, h) for h in handles))
