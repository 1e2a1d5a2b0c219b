"""Compacted snapshots: bounded however long the call, and never a different decision.

A snapshot stores `compact(state)`: the decision state without the conversation, without
calls settled for good (kept by id), handles no session can resume and generations outside
every reachable lineage. The properties: every decision (what is due, which handle to resume,
what an arriving tool call or cancellation leads to, the derived lists) taken on a compacted
state plus the later events equals the one taken on the fold from zero; a later event that
needs what was left out (a fresh session, an archived call) raises HistoryNeeded, and
load_state then folds the whole log; and the snapshot of a long call stays small.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from session_store import events as ev
from session_store.decide import (CancellationArrived, FunctionCall, SpeechStarted, SpeechStopped,
                                  ToolCallsArrived, decide)
from session_store.delivery import (ResolveInDoubt, SendResult, StartCall, choose_resumption, due,
                                    seed_history, unanswered, undelivered)
from session_store.policy import Policy
from session_store.compaction import compact
from session_store.lineage import unconfirmed_sends
from session_store.projection import fold, fold_into, from_snapshot, to_snapshot
from session_store.state import HistoryNeeded, SessionState

from .helpers import T0_US, record
from .test_projection_properties import _records, streams

HOUR_US = 3600 * 1_000_000


def decisions(state, probes) -> dict:
    """Everything the service decides from a state, plus what probe observations lead to."""
    policy = Policy()
    now = state.last_event_at_us
    hot = {c.call_id for c in state.calls.values()}
    return {
        "scalars": (state.version, state.generation, state.connected, state.bot_speaking,
                    state.epoch, state.closed, state.opened, state.reconnect_pending,
                    state.go_away_deadline_us, state.newest_handle, state.anomalies,
                    state.reconnects, state.takeovers, state.messages, state.worker),
        "settings": state.settings,
        "lists": [[c.call_id for c in calls] for calls in (
            state.pending(), state.in_doubt(), state.running(), undelivered(state),
            unanswered(state))],
        "due": [due(state, policy, t) for t in (now, now + 30 * 1_000_000, now + 3 * HOUR_US)],
        "resume": [choose_resumption(state, policy, t) for t in (now, now + HOUR_US,
                                                                 now + 3 * HOUR_US)],
        "probes": [decide(state, p, policy) for p in probes],
        "hot_calls": hot,
    }


def probes_for(full) -> list:
    """Observations that touch every call the full state knows: the same id again, the
    same request under a new id (re-issue / reuse), a cancellation of each."""
    gen = full.generation
    out = []
    for c in full.calls.values():
        out.append(ToolCallsArrived((FunctionCall(c.call_id, c.name, c.args),), gen))
        out.append(ToolCallsArrived((FunctionCall(f"new-{c.call_id}", c.name, c.args),), gen))
        out.append(CancellationArrived((c.call_id,), gen))
    return out


def compacted(state):
    """What load_state starts from: the compacted state, through its JSON."""
    return from_snapshot(to_snapshot(compact(state)))


@st.composite
def simulated_calls(draw, max_steps: int = 80):
    """A call as the service would log it: observations go through `decide`, effects come
    from `due` (starts, in-doubt resolutions, sends — some left unconfirmed), with handles,
    reconnects (to the handle `choose_resumption` picks, an older one, or fresh), takeovers,
    cancellations, re-asked and duplicate calls, and time passing (so calls settle for good).
    Returns the recorded events."""
    policy = Policy()
    state = SessionState(stream_id="sim")
    recs, t = [], T0_US
    ids = iter(range(10_000))

    def log(*events):
        for e in events:
            recs.extend(record("sim", [e], start_version=state.version + 1, t0_us=t))
            fold_into(state, recs[-1:])

    log(ev.SessionOpened("m", ["a", "b"], "w1", 1), ev.Connected(1))
    handles: list[str] = []
    for _ in range(draw(st.integers(1, max_steps))):
        t += draw(st.sampled_from([0, 200_000, 2_000_000, 8_000_000, 60_000_000]))
        if state.closed:
            break
        action = draw(st.sampled_from(["say", "speak", "stop", "calls", "calls", "due", "due",
                                       "finish", "handle", "reconnect", "attach", "cancel",
                                       "confirm"]))
        gen = state.generation
        if action == "say":
            log(ev.ConversationMessage(draw(st.sampled_from(["user", "assistant"])), "hi", gen))
        elif action in ("speak", "stop"):
            obs = SpeechStarted(gen) if action == "speak" else SpeechStopped(gen)
            log(*decide(state, obs, policy))
        elif action == "calls" and state.connected:
            known = sorted(state.calls)
            calls = []
            for _ in range(draw(st.integers(1, 2))):
                cid = (draw(st.sampled_from(known)) if known and draw(st.integers(0, 9)) == 0
                       else f"c{next(ids)}")
                calls.append(FunctionCall(cid, draw(st.sampled_from(["a", "b"])),
                                          {"x": draw(st.integers(0, 2))}))
            log(*decide(state, ToolCallsArrived(tuple(calls), gen), policy))
        elif action == "due":
            for effect in due(state, policy, t):
                if isinstance(effect, StartCall):
                    log(ev.ToolCallStarted(effect.call_id, effect.attempt, effect.idempotency_key,
                                           state.epoch))
                elif isinstance(effect, ResolveInDoubt):
                    log(ev.ToolCallFailed(effect.call_id, "unknown", outcome_unknown=True))
                elif isinstance(effect, SendResult):
                    log(ev.ToolResultSending(effect.call_id, gen, effect.via))
                    if draw(st.integers(0, 9)):  # now and then the process dies in between
                        log(ev.ToolResultSent(effect.call_id, gen, effect.via))
        elif action == "finish":
            running = [c.call_id for c in state.running()]
            if running:
                cid = draw(st.sampled_from(running))
                log(ev.ToolCallCompleted(cid, {"r": cid}) if draw(st.booleans())
                    else ev.ToolCallFailed(cid, "boom"))
        elif action == "handle" and state.connected:
            handles.append(f"h{next(ids)}")
            log(ev.HandleIssued(gen, handles[-1]))
        elif action == "reconnect":
            if state.connected:
                log(ev.Disconnected(gen, "error"))
            choice = draw(st.sampled_from(["chosen"] * 6 + ["fresh", "older"]))
            handle = (choose_resumption(state, policy, t) if choice == "chosen"
                      else draw(st.sampled_from(handles)) if choice == "older" and handles
                      else None)
            log(ev.Connected(gen + 1, handle))
        elif action == "attach":
            log(ev.WorkerAttached(f"w{state.epoch + 1}", state.epoch + 1))
        elif action == "cancel" and state.calls:
            log(*decide(state, CancellationArrived(
                (draw(st.sampled_from(sorted(state.calls))),), gen), policy))
        elif action == "confirm":
            open_sends = [(c.call_id, s) for c, s in unconfirmed_sends(state)]
            if open_sends:
                cid, send = draw(st.sampled_from(open_sends))
                log(ev.ToolResultSent(cid, send.generation, send.via))
    return recs


@settings(max_examples=200, deadline=None, database=None)
@given(simulated_calls(), st.data())
def test_decisions_on_a_compacted_state_equal_those_on_the_full_fold(recs, data):
    cut = data.draw(st.integers(0, len(recs)))
    full = fold(recs)
    start = compacted(fold(recs[:cut]))
    try:
        resumed = fold_into(start, recs[cut:])
    except HistoryNeeded:
        return  # load_state folds the whole log then (tested below)
    probes = probes_for(full)
    got, want = decisions(resumed, probes), decisions(full, probes)
    assert got.pop("hot_calls") <= want.pop("hot_calls")
    assert got == want
    for cid, call in resumed.calls.items():  # a call kept is kept whole
        assert call == full.calls[cid]


@settings(max_examples=60, deadline=None, database=None)
@given(streams(max_events=60))
def test_compaction_is_idempotent_and_never_needs_history_for_itself(drawn):
    state = fold(_records(drawn))
    once = compacted(state)
    assert to_snapshot(compact(once)) == to_snapshot(once)
    with pytest.raises(HistoryNeeded):
        seed_history(once)
    assert seed_history(state) is not None  # the full state seeds


# --------------------------------------------------------------------------- a long call

def long_call(turns: int, *, step_us: int = 2_000_000) -> list:
    """A call of `turns` turns: a tool call each (sent, confirmed), transcripts, a handle per
    turn, a reconnect with the newest handle every 8th turn; events `step_us` apart."""
    events = [ev.SessionOpened("m", ["lookup"], "w1", 1), ev.Connected(1)]
    gen, handle = 1, None
    for t in range(1, turns + 1):
        cid = f"c{t}"
        events += [ev.ConversationMessage("user", f"question {t}", gen),
                   ev.BotStartedSpeaking(gen),
                   ev.ToolCallRequested(cid, "lookup", {"turn": t}, gen),
                   ev.ToolCallDeferred(cid), ev.BotStoppedSpeaking(gen),
                   ev.ToolCallStarted(cid, 1, f"k{t}", 1),
                   ev.ToolCallCompleted(cid, {"answer": t}),
                   ev.ToolResultSending(cid, gen, "tool_response"),
                   ev.ToolResultSent(cid, gen, "tool_response"),
                   ev.ConversationMessage("assistant", f"answer {t}", gen)]
        handle = f"h{t}"
        events.append(ev.HandleIssued(gen, handle))
        if t % 8 == 0:
            events += [ev.Disconnected(gen, "go_away")]
            gen += 1
            events.append(ev.Connected(gen, handle))
    return record("long", events, step_us=step_us)


def test_a_long_calls_snapshot_stays_small():
    sizes = {}
    for turns in (100, 1000):
        small = compact(fold(long_call(turns)))
        assert len(small.calls) <= 6  # only calls inside the crossing window
        assert len(small.handles) == 1 and len(small.generations) <= 2
        assert len(small.archived) >= turns - 6
        # All that grows with the call: the archived ids (a duplicate id must still be
        # recognised as one), a few bytes per call.
        sizes[turns] = len(to_snapshot(small)) - sum(len(c) + 3 for c in small.archived)
    assert sizes[1000] < 1.1 * sizes[100], sizes


def test_a_call_answered_exactly_one_crossing_window_ago_is_kept():
    """c1's answer went into a fresh session as its seed; the last event is exactly one
    crossing window later. A re-ask now may still have crossed the answer (the window is
    inclusive), so it is answered from the record, and the compacted state must still hold
    c1 to decide the same. (Archived at the boundary, c1 would be run again: I3.)"""
    window_us = int(Policy().crossing_window_s * 1e6)
    seeded_at = T0_US + 10_000_000
    events = [ev.SessionOpened("m", ["lookup"], "w1", 1), ev.Connected(1),
              ev.ToolCallRequested("c1", "lookup", {"order": 7}, 1),
              ev.ToolCallStarted("c1", 1, "k", 1), ev.Disconnected(1, "error"),
              ev.ToolCallCompleted("c1", {"status": "shipped"}), ev.Connected(2),
              ev.ToolResultSending("c1", 2, "seed"), ev.ToolResultSent("c1", 2, "seed"),
              ev.ConversationMessage("user", "and?", 2)]
    times = [T0_US + i for i in range(7)] + [seeded_at - 1, seeded_at, seeded_at + window_us]
    full = fold(record("call", events, recorded_at_us=times))
    re_ask = ToolCallsArrived((FunctionCall("c2", "lookup", {"order": 7}),), 2)
    want = [ev.ToolCallRequested("c2", "lookup", {"order": 7}, 2),
            ev.ToolCallCompleted("c2", {"status": "shipped"}, reused_from="c1")]
    assert decide(full, re_ask, Policy()) == want
    small = compacted(full)
    assert "c1" in small.calls
    assert decide(small, re_ask, Policy()) == want

def test_a_fresh_session_on_a_compacted_state_needs_the_whole_history():
    recs = long_call(30)
    state = compacted(fold(recs))
    more = record("long", [ev.Disconnected(state.generation, "error"),
                           ev.Connected(state.generation + 1, None)],
                  start_version=len(recs) + 1, t0_us=T0_US + 100 * HOUR_US)
    with pytest.raises(HistoryNeeded):
        fold_into(state, more)
    resumed = compacted(fold(recs))
    fold_into(resumed, record("long", [ev.Disconnected(state.generation, "error"),
                                       ev.Connected(state.generation + 1, "h30")],
                              start_version=len(recs) + 1))
    assert resumed.generation == state.generation + 1 and not undelivered(resumed)
