"""Properties of the fold on random valid streams (Hypothesis), and snapshots in the log.

Streams come from a small state machine that only emits events valid at that point (calls
referenced exist, results are sent for calls with outcomes, ...), so every generated stream
is one a real shell could have written.
"""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from session_store import events as ev
from session_store.delivery import StartCall, due, undelivered
from session_store.policy import Policy
from session_store.lineage import in_model, walk
from session_store.projection import evolve, fold, from_snapshot, to_snapshot
from session_store.state import SessionState

from .helpers import T0_US, record

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False, width=32),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6)


# The tool-call lifecycle, furthest step first (see `streams`).
_LIFECYCLE = ["sent", "sending", "complete", "fail", "start", "request", "connect", "handle",
              "defer", "reissue"]


@st.composite
def streams(draw, max_events: int = 40):
    """(events, recorded_at_us) of one valid stream."""
    events: list[ev.Event] = [ev.SessionOpened("m", ["lookup", "book"], "w1", 1)]
    gen, connected, epoch = 0, False, 1
    calls: dict[str, dict] = {}  # id -> {"status", "outcome", "unconfirmed": [gen], "order"}
    handles: list[str] = []
    for _ in range(draw(st.integers(0, max_events))):
        options = ["speak", "stop", "interrupt", "settings", "message", "anomaly", "attach",
                   "reconnect_req", "close"]
        options += ["disconnect", "handle", "goaway", "request"] if connected else ["connect"]
        live_calls = [c for c, d in calls.items() if d["status"] != "cancelled"]
        requested = [c for c, d in calls.items() if d["status"] == "requested"]
        if requested:
            options.append("defer")
        # Re-issue: a requested call re-asks for an older one (links point backwards: no cycle).
        reissuable = [(n, o) for n in requested for o, d in calls.items()
                      if d["order"] < calls[n]["order"] and not d["superseded"]
                      and not calls[n]["superseded"]]
        if reissuable:
            options.append("reissue")
        if [c for c, d in calls.items() if d["status"] in ("requested", "deferred", "started")]:
            options.append("start")
        if [c for c, d in calls.items() if d["status"] == "started"]:
            options += ["complete", "fail"]
        if live_calls:
            options.append("cancel")
        if connected and [c for c, d in calls.items() if d["outcome"]]:
            options.append("sending")
        if [c for c, d in calls.items() if d["unconfirmed"]]:
            options.append("sent")
        # The tool-call lifecycle first, its furthest step available first, and four times
        # over: Hypothesis favours the first choices, and with the options in name order 150
        # streams held 33 requests, one start and not one send (691 anomalies): the delivery
        # rules went untested.
        order = {a: i for i, a in enumerate(_LIFECYCLE)}
        options += [a for a in options if a in order] * 3
        action = draw(st.sampled_from(sorted(options, key=lambda a: (order.get(a, 99), a))))

        def pick(statuses=None, pred=lambda d: True):
            return draw(st.sampled_from(sorted(
                c for c, d in calls.items()
                if (statuses is None or d["status"] in statuses) and pred(d))))

        if action == "connect":
            gen += 1
            connected = True
            events.append(ev.Connected(gen, draw(st.sampled_from([None] + handles))))
        elif action == "disconnect":
            connected = False
            events.append(ev.Disconnected(gen, draw(st.sampled_from(["settings", "error"]))))
        elif action == "handle":
            handles.append(f"h{len(handles)}")
            events.append(ev.HandleIssued(gen, handles[-1],
                                          draw(st.none() | st.integers(0, 50))))
        elif action == "goaway":
            events.append(ev.GoAwayReceived(gen, draw(st.floats(0, 120))))
        elif action == "reconnect_req":
            events.append(ev.ReconnectRequested("settings", draw(st.lists(st.text(max_size=3),
                                                                          max_size=2))))
        elif action == "speak":
            events.append(ev.BotStartedSpeaking(gen))
        elif action == "stop":
            events.append(ev.BotStoppedSpeaking(gen))
        elif action == "interrupt":
            events.append(ev.Interrupted(gen))
        elif action == "settings":
            values = draw(st.dictionaries(st.sampled_from(["voice", "temperature"]), JSONISH,
                                          max_size=2))
            events.append(ev.SettingsChanged(sorted(values), values, draw(st.booleans())))
        elif action == "message":
            events.append(ev.ConversationMessage(draw(st.sampled_from(["user", "assistant"])),
                                                 draw(st.text(max_size=8)), gen))
        elif action == "anomaly":
            events.append(ev.AnomalyRecorded("odd", {"x": draw(JSONISH)}, gen))
        elif action == "attach":
            epoch += 1
            connected = False
            events.append(ev.WorkerAttached(f"w{epoch}", epoch))
        elif action == "close":
            connected = False
            events.append(ev.SessionClosed())
        elif action == "request":
            cid = f"c{len(calls)}"
            calls[cid] = {"status": "requested", "outcome": False, "unconfirmed": [],
                          "order": len(calls), "superseded": False}
            events.append(ev.ToolCallRequested(
                cid, draw(st.sampled_from(["lookup", "book"])),
                draw(st.dictionaries(st.sampled_from("ab"), JSONISH, max_size=2)), gen))
        elif action == "defer":
            cid = pick({"requested"})
            calls[cid]["status"] = "deferred"
            events.append(ev.ToolCallDeferred(cid))
        elif action == "reissue":
            new, original = draw(st.sampled_from(reissuable))
            calls[original]["superseded"] = True
            calls[new]["status"] = "awaiting"
            events.append(ev.ToolCallReissued(new, original))
        elif action == "start":
            cid = pick({"requested", "deferred", "started"})
            calls[cid]["status"] = "started"
            events.append(ev.ToolCallStarted(cid, draw(st.integers(1, 3)), f"k-{cid}", epoch))
        elif action in ("complete", "fail"):
            cid = pick({"started"})
            calls[cid].update(status="done", outcome=True)
            events.append(ev.ToolCallCompleted(cid, draw(JSONISH)) if action == "complete"
                          else ev.ToolCallFailed(cid, "boom", draw(st.booleans())))
        elif action == "cancel":
            cid = draw(st.sampled_from(sorted(live_calls)))
            calls[cid].update(status="cancelled")
            events.append(ev.ToolCallCancelled(cid, "server"))
        elif action == "sending":
            cid = pick(pred=lambda d: d["outcome"])
            calls[cid]["unconfirmed"].append(gen)
            events.append(ev.ToolResultSending(cid, gen, "tool_response"))
        elif action == "sent":
            cid = pick(pred=lambda d: d["unconfirmed"])
            g = calls[cid]["unconfirmed"].pop(draw(st.integers(0, len(
                calls[cid]["unconfirmed"]) - 1)))
            events.append(ev.ToolResultSent(cid, g, "tool_response"))
    times, t = [], T0_US
    for _ in events:
        t += draw(st.integers(0, 20_000_000))
        times.append(t)
    return events, times


def _records(drawn):
    events, times = drawn
    return record("call-p", events, recorded_at_us=times)


PROPS = settings(max_examples=150, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@PROPS
@given(streams(), st.data())
def test_fold_from_a_snapshot_equals_fold_from_zero(drawn, data):
    recs = _records(drawn)
    full = fold(recs)
    cut = data.draw(st.integers(0, len(recs)))
    prefix = fold(recs[:cut])
    text = to_snapshot(prefix)
    restored = from_snapshot(text)
    assert restored.to_json() == prefix.to_json()
    assert to_snapshot(restored) == text
    assert fold(recs[cut:], restored).to_json() == full.to_json()
    # ... in the same order too (JSON sorts keys; deferred calls start in request order)
    assert list(fold(recs[cut:], restored).calls) == list(full.calls)
    assert list(restored.handles) == list(prefix.handles)
    assert fold(recs[cut:], from_snapshot(json.dumps(json.loads(text)))).to_json() == \
        full.to_json()


@PROPS
@given(streams())
def test_evolve_step_by_step_equals_fold_and_never_mutates(drawn):
    recs = _records(drawn)
    s = SessionState()
    for r in recs:
        before = copy.deepcopy(s.to_json())
        new = evolve(s, r)
        assert s.to_json() == before, f"evolve mutated its input at {r.type}"
        assert new is not s and new.version == r.version
        s = new
    assert s.to_json() == fold(recs).to_json()
    mid = fold(recs[: len(recs) // 2])
    snapshot_of_mid = copy.deepcopy(mid.to_json())
    fold(recs[len(recs) // 2:], mid)
    assert mid.to_json() == snapshot_of_mid  # fold onto a state does not modify it


@PROPS
@given(streams())
def test_due_never_starts_a_deferrable_call_while_the_bot_speaks(drawn):
    """I4 on every reachable state; and nothing cancelled is ever started or sent."""
    recs = _records(drawn)
    s = SessionState()
    for r in recs:
        s = evolve(s, r)
        effects = due(s, Policy(), r.recorded_at_us)
        if s.bot_speaking:
            assert not [e for e in effects if isinstance(e, StartCall) and e.attempt == 1]
        for e in effects:
            call = s.calls.get(getattr(e, "call_id", None))
            assert call is None or call.status != "cancelled"


def test_fold_rejects_gaps_and_reorders():
    recs = record("s", [ev.SessionOpened("m", [], "w"), ev.Connected(1), ev.Connected(2)])
    with pytest.raises(ValueError, match="expected version 1, got 2"):
        fold(recs[1:])
    with pytest.raises(ValueError, match="gap or reorder"):
        fold([recs[0], recs[2], recs[1]])
    assert fold(recs[2:], fold(recs[:2])).version == 3


# --------------------------------------------------------------------------- snapshots in the log


def _held_walked_per_call(s: SessionState, call, handle=None) -> bool:
    """The delivery rule as DESIGN.md states it, walked for this one call: a confirmed send of
    it was made in a generation of the lineage, before that generation's cutoff."""
    lineage = walk(s, handle.generation, handle.version) if handle else walk(s)
    for gen, cutoff in lineage:
        if any(x.confirmed and x.generation == gen and (cutoff is None or x.version < cutoff)
               for x in call.sends):
            return True
    return False


@PROPS
@given(streams())
def test_the_lineage_walked_once_says_what_the_rule_says_per_call(drawn):
    """`undelivered` and `in_model` walk the lineage once for all calls (`due` asks them of
    every call of a call, several times per tool call); on every reachable state they agree
    with the rule walked per call, for the current session and for every kept handle."""
    recs = _records(drawn)
    s = SessionState()
    for r in recs:
        s = evolve(s, r)
        assert [c.call_id for c in undelivered(s)] == [
            c.call_id for c in s.calls.values()
            if c.has_outcome and not c.superseded_by and not _held_walked_per_call(s, c)]
        for c in s.calls.values():
            assert in_model(s, c) == _held_walked_per_call(s, c)
            for h in s.handles.values():
                assert in_model(s, c, h) == _held_walked_per_call(s, c, h)
