"""The sends a commit logs keep `due`'s order: a commit that logs only some kinds of sends (a
result's commit logs the results now due) does not put a later send ahead of an earlier one
of another kind. Seen in the phone bot's fleet under load: a resumed session was sent two
results before the turns its handle lacked, and the model said those turns again."""

from __future__ import annotations

from session_store import events as ev
from session_store.delivery import SendConversation, SendResult, due
from session_store.intents import ALL, intents
from session_store.policy import Policy

from .helpers import Log

POLICY = Policy()
MODEL = "models/gemini-2.5-flash-native-audio-preview"


def resumed_session_lacking_turns() -> Log:
    """Generation 1's handle predates the caller's request; the refund ran; the worker died
    and generation 2 resumed from that handle, holding all it was told."""
    log = Log()
    log.add(ev.SessionOpened(MODEL, ["refund_order"], "w1"), ev.Connected(1),
            ev.ConversationMessage("assistant", "Thanks for calling.", 1),
            ev.HandleIssued(1, "h1"),
            ev.ConversationMessage("user", "Please refund order 7.", 1),
            ev.ConversationMessage("assistant", "Let me refund order 7 for you.", 1),
            ev.ToolCallRequested("refund-1", "refund_order", {"order_id": 7}, 1),
            ev.ToolCallStarted("refund-1", 1, "call-1:refund-1", 1),
            ev.ToolCallCompleted("refund-1", {"refunded": True}),
            ev.WorkerAttached("w2", 2), ev.Connected(2, handle="h1"), ev.HoldsAll(2))
    return log


def test_the_turns_a_resumed_session_lacks_are_due_before_the_result():
    log = resumed_session_lacking_turns()
    effects = due(log.state(), POLICY, log.now_us)
    kinds = [type(e) for e in effects]
    assert SendConversation in kinds and SendResult in kinds
    assert kinds.index(SendConversation) < kinds.index(SendResult)


def test_a_commit_that_logs_only_results_holds_them_behind_the_turns():
    log = resumed_session_lacking_turns()
    s = log.state()
    effects = due(s, POLICY, log.now_us)
    assert intents(s, effects, frozenset({SendResult}), 2) == []
    logged = intents(s, effects, ALL, 2)
    assert [type(e) for e in logged] == [ev.ConversationSending, ev.ToolResultSending]


def test_results_with_nothing_before_them_are_logged_by_a_results_commit():
    log = resumed_session_lacking_turns()
    log.add(ev.ConversationSending(2, log.version, "content"),
            ev.ConversationSent(2, log.version, "content"))
    s = log.state()
    effects = due(s, POLICY, log.now_us)
    assert [type(e) for e in intents(s, effects, frozenset({SendResult}), 2)] == [
        ev.ToolResultSending]
