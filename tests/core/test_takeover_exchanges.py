"""No step repeated after a takeover (issue #32 item 4), on hand-built streams (pure).

No handle is issued while a blocking call is open, so after a worker dies mid-tool the
newest handle predates the call the caller heard announced. A session resumed from it lacks
the exchange: 2.5 is told it as content, 3.x (no clientContent mid-session) is not resumed
from such a handle but seeded, and a seed names a call still running."""

from __future__ import annotations

import pytest

from session_store import events as ev
from session_store.delivery import (SendConversation, SendResult, catch_up_turns,
                                    choose_resumption, due, seed_plan)
from session_store.lineage import unheld_calls
from session_store.policy import Policy

from .helpers import Log

G25 = "models/gemini-2.5-flash-native-audio-preview-09-2025"
G31 = "gemini-3.1-flash-live-preview"
G38 = "gemini-3.8-live"
ALL = Policy()
REFUND = '[Called function refund_order with args {"order_id": 7}]'


def killed_mid_refund(model: str, *, finished: bool) -> Log:
    """Greeting, a handle, the caller's request, the bot's "let me refund" and the call it
    started; the worker dies (the new one's WorkerAttached), the result logged or not."""
    log = Log()
    log.add(ev.SessionOpened(model=model, tools=["refund_order"], worker="w1", epoch=1,
                             settings={"model": model, "system_instruction": "Be brief."}),
            ev.Connected(1),
            ev.ConversationMessage("assistant", "Thanks for calling.", 1),
            ev.HandleIssued(1, "h1"),
            ev.ConversationMessage("user", "Refund order 7.", 1),
            ev.ConversationMessage("assistant", "Let me refund order 7.", 1),
            ev.ToolCallRequested("r1", "refund_order", {"order_id": 7}, 1),
            ev.ToolCallStarted("r1", 1, "call-1:r1", 1))
    if finished:
        log.add(ev.ToolCallCompleted("r1", {"refunded": True}))
    log.add(ev.WorkerAttached("w2", 2))
    return log


@pytest.mark.parametrize("finished", [False, True])
def test_the_handle_before_the_call_lacks_its_exchange(finished):
    log = killed_mid_refund(G25, finished=finished)
    state = log.state()
    assert unheld_calls(state, state.handles["h1"]) == ["r1"]
    # The session that asked for it holds it.
    assert unheld_calls(state) == []


@pytest.mark.parametrize("model", [G31, G38])
def test_on_3x_a_handle_lacking_a_call_is_not_resumed_and_the_seed_names_it(model):
    log = killed_mid_refund(model, finished=False)
    state = log.state()
    assert choose_resumption(state, ALL, log.now_us) is None
    plan = seed_plan(state)
    # What the caller heard, then the call under way (its result comes when it exists).
    assert plan.turns[-3:] == [("user", "Refund order 7."),
                               ("assistant", "Let me refund order 7."), ("assistant", REFUND)]
    assert plan.parts == [] and plan.through == state.calls["r1"].requested_version
    # Seeded: the seed covers the call; a handle of the seeded session holds it.
    log.add(ev.Connected(2), ev.ConversationSending(2, plan.through, "seed"),
            ev.ConversationSent(2, plan.through, "seed"), ev.HandleIssued(2, "h2"))
    state = log.state()
    assert unheld_calls(state) == [] and unheld_calls(state, state.handles["h2"]) == []
    assert choose_resumption(state, ALL, log.now_us) == "h2"


def test_on_3x_a_handle_after_the_answered_call_is_still_resumed():
    log = killed_mid_refund(G38, finished=True)
    log.add(ev.ToolResultSending("r1", 1, "tool_response"),
            ev.ToolResultSent("r1", 1, "tool_response"), ev.HandleIssued(1, "h-after"))
    assert choose_resumption(log.state(), ALL, log.now_us) == "h-after"


def test_on_2_5_a_resumed_session_is_told_the_call_then_its_result():
    log = killed_mid_refund(G25, finished=True)
    assert choose_resumption(log.state(), ALL, log.now_us) == "h1"
    log.add(ev.Connected(2, "h1"))
    state = log.state()
    call_version = state.calls["r1"].requested_version
    effects = due(state, ALL, log.now_us)
    # The turns and the call first (in log order), then the result: both as content.
    assert effects == [SendConversation(call_version), SendResult("r1", "content")]
    assert catch_up_turns(state, call_version) == [
        ("user", "Refund order 7."), ("assistant", "Let me refund order 7."),
        ("assistant", REFUND)]
    log.add(ev.ConversationSending(2, call_version, "content"),
            ev.ConversationSent(2, call_version, "content"))
    state = log.state()
    assert unheld_calls(state) == [] and due(state, ALL, log.now_us) == [
        SendResult("r1", "content")]


def test_cancelled_calls_are_neither_told_nor_seeded():
    log = killed_mid_refund(G38, finished=False)
    log.add(ev.ToolCallRequested("x1", "refund_order", {"order_id": 8}, 1),
            ev.ToolCallCancelled("x1", "server"))
    state = log.state()
    assert unheld_calls(state, state.handles["h1"]) == ["r1"]
    assert not any("8" in text for _role, text in seed_plan(state).turns)
