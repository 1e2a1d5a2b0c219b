"""Arguments a caller can get wrong are refused where they are given, with a message that
says what to give instead: before, a typo was taken silently (Policy(defer="lookup_order"):
a string, not a set of names, deferred no tool at all; idempotent="lookup_order" matched any
tool whose name is a substring of it; speaking_signal="models" meant "transport"), or failed
later and elsewhere (a bad call id at the first append, reported as a connection error; a
store not awaited at the pipeline's start)."""

from __future__ import annotations

import pytest

from service.driver import CallDriver
from service.gemini_live import DurableGeminiLiveLLMService
from session_store import Policy
from session_store.decide import FunctionCall, ToolCallsArrived, decide
from session_store.state import SessionState


@pytest.mark.parametrize("kwargs, says", [
    ({"defer": "lookup_order"}, "not the string 'lookup_order' (for one tool: {'lookup_order'})"),
    ({"defer": "al"}, "'all', 'none' or a set of tool names"),
    ({"reuse_equivalent": "lookup_order"}, "Policy.reuse_equivalent must be"),
    ({"idempotent": "lookup_order"}, "Policy.idempotent must be a set of tool names"),
    ({"idempotent": "all"}, "Policy.idempotent must be a set of tool names"),
    ({"defer": 3}, "Policy.defer must be"),
    ({"defer": [1, 2]}, "Policy.defer must be"),
    ({"go_away_margin_s": -1}, "Policy.go_away_margin_s must be a number of seconds >= 0"),
    ({"crossing_window_s": float("nan")}, "Policy.crossing_window_s"),
    ({"crossing_window_s": "10"}, "Policy.crossing_window_s"),
    ({"max_args_bytes": 0}, "Policy.max_args_bytes must be a whole number >= 1"),
    ({"handle_ttl_us": 1.5}, "Policy.handle_ttl_us"),
])
def test_a_policy_refuses_what_it_would_misread(kwargs, says):
    with pytest.raises(ValueError) as err:
        Policy(**kwargs)
    assert says in str(err.value)


def test_a_policy_takes_any_collection_of_names():
    policy = Policy(defer=["lookup_order"], idempotent=("get_weather",),
                    reuse_equivalent={"lookup_order"})
    assert policy.defer == policy.reuse_equivalent == frozenset({"lookup_order"})
    assert policy.defers("lookup_order") and not policy.defers("get_weather")
    assert policy.is_idempotent("get_weather") and not policy.is_idempotent("weather")
    assert Policy(defer="none").defer == "none" and Policy().defer == "all"
    # As the service uses it: a named tool is deferred while the bot speaks, another is not.
    state = SessionState(stream_id="c")
    state.bot_speaking = True
    events = decide(state, ToolCallsArrived((FunctionCall("a", "lookup_order", {}),
                                             FunctionCall("b", "get_weather", {})), 1), policy)
    assert [e.call_id for e in events if e.TYPE == "tool.call_deferred"] == ["a"]


async def test_the_service_refuses_bad_arguments_at_construction(store):
    good = dict(api_key="k", store=store, call_id="call-1")
    DurableGeminiLiveLLMService(**good)  # (the control: these construct)
    bad = [
        ({"call_id": ""}, ValueError, "call_id must be text"),
        ({"call_id": "a\x00b"}, ValueError, "call_id must be text"),
        ({"call_id": "x" * 300}, ValueError, "of 1 to 255 characters"),
        ({"call_id": 42}, ValueError, "call_id must be text"),
        ({"policy": {"defer": "none"}}, TypeError, "policy must be a session_store.Policy"),
        ({"snapshot_every": 0}, ValueError, "snapshot_every must be a whole number >= 1"),
        ({"speaking_signal": "models"}, ValueError, "'transport' or 'model'"),
        ({"speaking_timeout_s": 0}, ValueError, "speaking_timeout_s must be a number of "
                                                "seconds > 0"),
        ({"reconnect_window_s": -5}, ValueError, "reconnect_window_s must be"),
        ({"max_frame_bytes": 0}, ValueError, "max_frame_bytes must be a whole number >= 1"),
    ]
    for change, error, says in bad:
        with pytest.raises(error) as err:
            DurableGeminiLiveLLMService(**{**good, **change})
            pytest.fail(f"constructed with {change}")
        assert says in str(err.value), (change, str(err.value))


async def test_a_store_not_awaited_is_named_as_such(migrated):
    pending = migrated.open()  # (open_store with this backend's options, not awaited)
    try:
        with pytest.raises(TypeError, match=r"await session_store.open_store\(url\) first"):
            CallDriver(pending, "call-1")
    finally:
        await (await pending).close()
    with pytest.raises(TypeError, match="store must be an open session store"):
        CallDriver(migrated.url, "call-1")
