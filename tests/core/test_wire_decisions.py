"""decide on what a hostile Gemini Live server sends (issue #6): function calls without id or
name, for unknown tools, with repeated ids, huge or unstorable arguments; messages the shell
could not take in. Pure: hand-built streams, no I/O (the wire tests are in tests/faults)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from session_store import events as ev
from session_store.decide import (NO_NAME_ERROR, FunctionCall, ServerMessageRejected,
                                  ToolCallsArrived, bounded, decide)
from session_store.delivery import Reconnect, SendResult, StartCall, due
from session_store.policy import Policy
from session_store.events import canonical_json

from .helpers import Log, opened

ALL = Policy()


def live() -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1))
    return log


def arrive(log: Log, *calls: FunctionCall, policy: Policy = ALL) -> list[ev.Event]:
    out = decide(log.state(), ToolCallsArrived(tuple(calls), 1), policy)
    log.add(*out)
    return out


def kinds(events) -> list[str]:
    return [e.kind for e in events if isinstance(e, ev.AnomalyRecorded)]


def storable(events) -> bool:
    return all(canonical_json(e.to_data()).encode() for e in events)


def test_a_call_without_name_is_failed_and_answered_not_run():
    log = live()
    out = arrive(log, FunctionCall("c1", None, {"a": 1}))
    assert kinds(out) == ["tool_call_without_name"]
    assert ev.ToolCallRequested("c1", "", {"a": 1}, 1) in out
    assert ev.ToolCallFailed("c1", NO_NAME_ERROR) in out
    effects = due(log.state(), ALL, log.now_us)
    assert effects == [SendResult("c1", "tool_response")]  # answered, never started


def test_a_call_with_neither_id_nor_name_is_only_logged():
    log = live()
    out = arrive(log, FunctionCall("gen1-x", None, {}, id_generated=True))
    assert kinds(out) == ["tool_call_without_name"] and len(out) == 1
    assert out[0].detail["call_id"] is None
    assert log.state().calls == {}


def test_a_made_up_id_is_logged_and_the_call_runs_under_it():
    log = live()
    out = arrive(log, FunctionCall("gen1-x", "lookup", {"id": 1}, id_generated=True))
    assert kinds(out) == ["tool_call_without_id"]
    assert out[0].detail == {"call_id": "gen1-x", "name": "lookup"}
    assert [e.call_id for e in due(log.state(), ALL, log.now_us)
            if isinstance(e, StartCall)] == ["gen1-x"]


def test_an_unknown_tool_is_failed_with_its_name_never_started():
    log = live()
    out = arrive(log, FunctionCall("c1", "launch", {}, has_handler=False))
    assert kinds(out) == ["unknown_tool"]
    (failed,) = [e for e in out if isinstance(e, ev.ToolCallFailed)]
    assert "'launch'" in failed.error
    assert not [e for e in due(log.state(), ALL, log.now_us) if isinstance(e, StartCall)]


def test_arguments_over_the_limit_are_replaced_by_a_stand_in_and_the_call_failed():
    policy = Policy(max_args_bytes=100)
    log = live()
    at_limit = {"b": "x" * (100 - len('{"b":""}'))}
    over = {"b": "x" * 500}
    out = arrive(log, FunctionCall("ok", "lookup", at_limit),
                 FunctionCall("big", "lookup", over), policy=policy)
    assert kinds(out) == ["tool_args_too_large"]
    assert log.state().calls["ok"].args == at_limit
    stand_in = log.state().calls["big"].args
    assert stand_in["_omitted_bytes"] == len(canonical_json(over)) and len(
        canonical_json(stand_in)) < 300
    assert log.state().calls["big"].status == "failed"
    assert "too large" in log.state().calls["big"].error


def test_arguments_json_cannot_store_fail_the_call():
    log = live()
    out = arrive(log, FunctionCall("nan", "lookup", {"v": float("nan")}),
                 FunctionCall("sur", "lookup", {"s": "\ud800"}))
    assert kinds(out) == ["invalid_tool_args", "invalid_tool_args"]
    assert storable(out)
    assert {log.state().calls[c].status for c in ("nan", "sur")} == {"failed"}


def test_an_id_that_cannot_be_stored_resyncs_the_session():
    log = live()
    out = arrive(log, FunctionCall("bad\ud800", "lookup", {}))
    assert kinds(out) == ["malformed_message"] and storable(out)
    assert ev.ReconnectRequested("malformed_message") in out
    assert log.state().calls == {}
    assert Reconnect("malformed_message") in due(log.state(), ALL, log.now_us)


def test_repeated_ids_are_logged_with_where_the_first_was():
    log = live()
    out = arrive(log, FunctionCall("d1", "lookup", {"a": 1}), FunctionCall("d1", "book", {}))
    assert out[-1].detail["first"] == "same_tool_call" and out[-1].detail["name"] == "book"
    out = arrive(log, FunctionCall("d1", "lookup", {"a": 1}))
    assert kinds(out) == ["duplicate_tool_call_id"] and out[0].detail["first"] == "earlier_call"
    assert len(log.state().calls) == 1


def test_a_rejected_message_resyncs_only_the_live_session_and_only_once():
    log = live()
    out = decide(log.state(), ServerMessageRejected("malformed_message", {"frame": "{x"}, 1), ALL)
    assert out == [ev.AnomalyRecorded("malformed_message", {"frame": "{x"}, 1),
                   ev.ReconnectRequested("malformed_message")]
    log.add(*out)
    again = decide(log.state(), ServerMessageRejected("malformed_message", {}, 1), ALL)
    assert kinds(again) == ["malformed_message"] and len(again) == 1  # already pending
    old = decide(live().state(), ServerMessageRejected("malformed_message", {}, 0), ALL)
    assert len(old) == 1  # from a session already left
    unknown = decide(live().state(), ServerMessageRejected("unknown_message", {}, 1), ALL)
    assert kinds(unknown) == ["unknown_message"] and len(unknown) == 1


def test_anomaly_details_are_bounded_and_storable():
    detail = {"frame": "x" * 10_000, "fields": [str(i) for i in range(100)],
              "nested": {"a": {"b": {"c": {"d": {"e": "deep" * 1000}}}}},
              "nan": float("nan"), "text": "caf\udce9", "k" * 500: 1}
    out = bounded(detail)
    text = canonical_json(out)
    assert len(text.encode()) < 3000
    assert out["nan"] == "nan" and out["text"] == "caf\\udce9"
    assert len(out["fields"]) == 21


# Anything the SDK lets through: text with lone surrogates, NaN, nested values, huge strings.
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                   max_size=3),
    max_leaves=10)
hostile_calls = st.builds(
    FunctionCall,
    call_id=st.none() | st.sampled_from(["c1", "c2", "c\ud800"]) | st.text(max_size=6),
    name=st.none() | st.sampled_from(["lookup", "", "x\udfff"]) | st.text(max_size=6),
    args=values | st.dictionaries(st.text(max_size=5), values, max_size=4)
    | st.builds(lambda n: {"blob": "y" * n}, st.integers(0, 300)),
    id_generated=st.booleans(), has_handler=st.booleans())


@settings(max_examples=100, deadline=None, database=None)
@given(batches=st.lists(st.lists(hostile_calls, min_size=1, max_size=4), min_size=1,
                        max_size=4))
def test_no_tool_call_batch_breaks_decide_or_the_log(batches):
    """Whatever arrives, decide returns events the log can store, never records an id
    twice, and every recorded call is either runnable or already answered."""
    policy = Policy(max_args_bytes=200)
    log = live()
    for batch in batches:
        out = arrive(log, *batch, policy=policy)
        assert storable(out)
        json.dumps([e.to_data() for e in out], allow_nan=False)
    requested = [e.call_id for e in log.events if isinstance(e, ev.ToolCallRequested)]
    assert len(requested) == len(set(requested))
    for call in log.state().calls.values():
        assert call.status in ("requested", "awaiting", "failed") and canonical_json(call.args)
