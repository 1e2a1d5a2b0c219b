"""Delivery rules (I2) on hand-built streams: which results the current model state holds
across resumed and fresh generations, how undelivered results are sent, which handle to
resume from, re-issued equivalent calls, and the seeded history of a fresh session."""

from __future__ import annotations

import json

from session_store import events as ev
from session_store.decide import FunctionCall, ToolCallsArrived, decide
from session_store.delivery import (Reconnect, SendResult, choose_resumption, due,
                                    result_as_content, seed_history, session_knows_call,
                                    unanswered, undelivered, waits_for_silence)
from session_store.lineage import in_model
from session_store.policy import HANDLE_TTL_US, Policy

from .helpers import Log, opened

ALL = Policy()


def completed_call(log: Log, cid: str = "c1", gen: int = 1, result=None, name="lookup",
                   args=None) -> None:
    log.add(ev.ToolCallRequested(cid, name, args or {"q": cid}, gen),
            ev.ToolCallStarted(cid, 1, f"call-1:{cid}", 1),
            ev.ToolCallCompleted(cid, {"answer": cid} if result is None else result))


def sent(log: Log, cid: str = "c1", gen: int = 1, via: str = "tool_response",
         confirm: bool = True) -> int:
    v = log.add(ev.ToolResultSending(cid, gen, via))
    if confirm:
        log.add(ev.ToolResultSent(cid, gen, via))
    return v


def handle(log: Log, name: str, gen: int = 1) -> int:
    return log.add(ev.HandleIssued(gen, name))


def reconnect(log: Log, gen: int, from_handle: str | None) -> None:
    log.add(ev.Disconnected(gen - 1, "go_away"), ev.Connected(gen, handle=from_handle))


def base() -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1))
    return log


def sends(effects) -> list[SendResult]:
    return [e for e in effects if isinstance(e, SendResult)]


# --------------------------------------------------------------------------- in_model

def test_result_sent_on_the_live_session_is_delivered():
    log = base()
    completed_call(log)
    s = log.state()
    assert [c.call_id for c in undelivered(s)] == ["c1"]
    assert sends(due(s, ALL, log.now_us)) == [SendResult("c1", "tool_response")]
    sent(log, confirm=False)  # write-ahead intent only: a send is under way, do not repeat
    s = log.state()
    assert not in_model(s, s.calls["c1"]) and sends(due(s, ALL, log.now_us)) == []
    log.add(ev.ToolResultSent("c1", 1, "tool_response"))
    s = log.state()
    assert in_model(s, s.calls["c1"]) and undelivered(s) == [] and unanswered(s) == []
    assert due(s, ALL, log.now_us) == []


def test_resumed_from_a_handle_issued_after_the_send_keeps_the_result():
    log = base()
    completed_call(log)
    sent(log)
    handle(log, "h-after")
    reconnect(log, 2, "h-after")
    s = log.state()
    c1 = s.calls["c1"]
    assert in_model(s, c1) and session_knows_call(s, c1)
    assert s.generations[2].parent == 1 and s.generations[2].handle == "h-after"
    assert due(s, ALL, log.now_us) == []
    # ... and through a chain of resumptions.
    handle(log, "h-gen2", gen=2)
    reconnect(log, 3, "h-gen2")
    s = log.state()
    assert in_model(s, s.calls["c1"]) and undelivered(s) == []


def test_resumed_from_a_handle_issued_before_the_call_needs_content():
    log = base()
    handle(log, "h-before")
    completed_call(log)
    sent(log)
    handle(log, "h-after")
    reconnect(log, 2, "h-before")
    s = log.state()
    c1 = s.calls["c1"]
    assert not in_model(s, c1) and not session_knows_call(s, c1)
    assert sends(due(s, ALL, log.now_us)) == [SendResult("c1", "content")]  # unknown id
    sent(log, gen=2, via="content")
    s = log.state()
    assert in_model(s, s.calls["c1"]) and due(s, ALL, log.now_us) == []


def test_a_result_as_content_waits_while_the_bot_speaks():
    """Content interrupts the model's generation under way (LiveClientContent): a result the
    session never asked for waits for silence; a toolResponse the model waits for does not."""
    log = base()
    handle(log, "h-before")
    completed_call(log)
    sent(log)
    reconnect(log, 2, "h-before")
    completed_call(log, "c2", gen=2)
    log.add(ev.BotStartedSpeaking(2))
    s = log.state()
    assert sends(due(s, ALL, log.now_us)) == [SendResult("c2", "tool_response")]
    assert waits_for_silence(s)  # the stop must be logged at once: a send waits for it
    log.add(ev.BotStoppedSpeaking(2))
    s = log.state()
    assert sends(due(s, ALL, log.now_us)) == [SendResult("c1", "content"),
                                              SendResult("c2", "tool_response")]


def test_resumed_from_a_handle_between_request_and_send_answers_the_known_id():
    log = base()
    log.add(ev.ToolCallRequested("c1", "lookup", {}, 1))
    handle(log, "h-mid")
    log.add(ev.ToolCallStarted("c1", 1, "k", 1), ev.ToolCallCompleted("c1", 42))
    sent(log)
    reconnect(log, 2, "h-mid")
    s = log.state()
    assert session_knows_call(s, s.calls["c1"]) and not in_model(s, s.calls["c1"])
    assert sends(due(s, ALL, log.now_us)) == [SendResult("c1", "tool_response")]


def test_fresh_session_does_not_hold_earlier_results():
    log = base()
    completed_call(log)
    sent(log)
    reconnect(log, 2, None)
    s = log.state()
    assert s.generations[2].parent is None
    assert not in_model(s, s.calls["c1"]) and not session_knows_call(s, s.calls["c1"])
    assert sends(due(s, ALL, log.now_us)) == [SendResult("c1", "content")]
    sent(log, gen=2, via="seed")
    assert undelivered(log.state()) == []


def test_unconfirmed_send_of_a_dead_generation_is_sent_again():
    log = base()
    completed_call(log)
    sent(log, confirm=False)  # socket closed between intent and confirmation
    log.add(ev.Disconnected(1, "error"))
    assert due(log.state(), ALL, log.now_us) == [Reconnect("connection_lost")]
    log.add(ev.Connected(2))
    assert sends(due(log.state(), ALL, log.now_us)) == [SendResult("c1", "content")]


def test_a_late_confirmation_confirms_only_its_generation():
    log = base()
    completed_call(log)
    sent(log, gen=1, confirm=False)
    reconnect(log, 2, None)
    sent(log, gen=2, via="content", confirm=False)
    log.add(ev.ToolResultSent("c1", 1, "tool_response"))
    s = log.state()
    assert [x.confirmed for x in s.calls["c1"].sends] == [True, False]
    assert not in_model(s, s.calls["c1"])  # generation 1's state is gone


# --------------------------------------------------------------------------- choose_resumption

def test_resume_from_the_newest_live_handle():
    log = base()
    assert choose_resumption(log.state(), ALL, log.now_us) is None
    handle(log, "h1")
    handle(log, "h2")
    s = log.state()
    assert choose_resumption(s, ALL, log.now_us) == "h2"
    issued = s.handles["h2"].issued_at_us
    assert choose_resumption(s, ALL, issued + HANDLE_TTL_US) == "h2"
    assert choose_resumption(s, ALL, issued + HANDLE_TTL_US + 1) is None  # both expired
    short = Policy(handle_ttl_us=1)
    assert choose_resumption(s, short, s.handles["h1"].issued_at_us + 1) == "h2"


def test_a_handle_the_server_refused_is_passed_over_for_an_older_one():
    log = base()
    handle(log, "h1")
    handle(log, "h2")
    s = log.state()
    assert choose_resumption(s, ALL, log.now_us, exclude={"h2"}) == "h1"
    assert choose_resumption(s, ALL, log.now_us, exclude={"h1", "h2"}) is None


def test_unconfirmed_send_limits_the_handle_to_one_issued_before_it():
    log = base()
    handle(log, "h1")
    completed_call(log)
    sent(log, confirm=False)
    handle(log, "h2")  # its state may or may not hold the result
    assert choose_resumption(log.state(), ALL, log.now_us) == "h1"
    log.add(ev.ToolResultSent("c1", 1, "tool_response"))
    assert choose_resumption(log.state(), ALL, log.now_us) == "h2"


def test_an_old_unconfirmed_send_does_not_pin_every_later_resumption():
    """A send left unconfirmed in generation 1 cannot be in the state of a handle issued in a
    generation that resumed from before it: that handle is safe, and the newest."""
    log = base()
    handle(log, "h1")
    completed_call(log)
    sent(log, gen=1, confirm=False)
    reconnect(log, 2, "h1")
    sent(log, gen=2, via="content")
    log.add(ev.ConversationMessage("user", "what we said in generation 2", 2))
    handle(log, "h2", gen=2)
    s = log.state()
    assert in_model(s, s.calls["c1"])
    assert choose_resumption(s, ALL, log.now_us) == "h2"


# --------------------------------------------------------------------------- re-issued calls

def _lost_answer_log() -> Log:
    """c1 answered on generation 1, then a resume from a handle older than c1."""
    log = base()
    handle(log, "h0")
    completed_call(log, result={"temp": 21})
    sent(log)
    reconnect(log, 2, "h0")
    return log


def ask(log: Log, cid: str, name: str = "lookup", args=None, policy: Policy = ALL):
    return decide(log.state(), ToolCallsArrived((FunctionCall(cid, name, args or {"q": "c1"}),),
                                                2), policy)


def test_equivalent_reissued_call_is_answered_from_the_record():
    log = _lost_answer_log()
    out = ask(log, "c2")
    assert out == [ev.ToolCallRequested("c2", "lookup", {"q": "c1"}, 2),
                   ev.ToolCallCompleted("c2", {"temp": 21}, reused_from="c1")]
    log.add(*out)
    s = log.state()
    assert s.calls["c2"].status == "completed" and s.calls["c2"].attempt == 0  # never ran
    effects = due(s, ALL, log.now_us)
    assert SendResult("c2", "tool_response") in effects
    assert not any(getattr(e, "call_id", None) == "c2" and e.__class__.__name__ == "StartCall"
                   for e in effects)


def test_equivalent_call_runs_normally_when_the_old_result_is_in_the_model():
    log = base()
    completed_call(log)
    sent(log)
    assert ask(log, "c2") == [ev.ToolCallRequested("c2", "lookup", {"q": "c1"}, 2)]


def test_no_reuse_for_other_arguments_or_when_the_policy_says_so():
    log = _lost_answer_log()
    assert len(ask(log, "c2", args={"q": "other"})) == 1
    assert len(ask(log, "c2", name="book")) == 1
    assert len(ask(log, "c2", policy=Policy(reuse_equivalent="none"))) == 1
    assert len(ask(log, "c2", policy=Policy(reuse_equivalent=frozenset({"book"})))) == 1
    assert len(ask(log, "c2", policy=Policy(reuse_equivalent=frozenset({"lookup"})))) == 2


def test_reissue_of_a_running_call_waits_for_its_outcome():
    log = base()
    handle(log, "h0")
    log.add(ev.ToolCallRequested("c1", "lookup", {"q": "c1"}, 1),
            ev.ToolCallStarted("c1", 1, "k", 1))
    reconnect(log, 2, "h0")
    out = ask(log, "c2")
    assert out == [ev.ToolCallRequested("c2", "lookup", {"q": "c1"}, 2),
                   ev.ToolCallReissued("c2", "c1")]
    log.add(*out)
    assert [e for e in due(log.state(), ALL, log.now_us)] == []  # nothing runs twice
    log.add(ev.ToolCallCompleted("c1", "done"))
    s = log.state()
    assert s.calls["c2"].status == "completed" and s.calls["c2"].result == "done"
    assert due(s, ALL, log.now_us) == [SendResult("c2", "tool_response")]


# --------------------------------------------------------------------------- seeded history

def test_seed_history_holds_each_outcome_once_verbatim_in_log_order():
    log = base()
    log.add(ev.ConversationMessage("user", "book me a seat", 1))
    completed_call(log, "c1", name="book", args={"seat": "4A"}, result={"ok": True, "n": [1]})
    log.add(ev.ToolCallRequested("c2", "lookup", {}, 1), ev.ToolCallCancelled("c2", "server"))
    log.add(ev.ToolCallRequested("c3", "lookup", {}, 1), ev.ToolCallStarted("c3", 1, "k", 1))
    log.add(ev.ToolCallRequested("c4", "pay", {"amount": 5}, 1),
            ev.ToolCallFailed("c4", "card declined"))
    log.add(ev.ConversationMessage("assistant", "done", 1))
    s = log.state()
    turns = seed_history(s)
    assert turns == [
        ("user", "book me a seat"),
        ("assistant", '[Called function book with args {"seat": "4A"}]'),
        ("user", result_as_content(s.calls["c1"])),
        # Running: asked for, its result to come (the model must not ask again).
        ("assistant", '[Called function lookup with args {}]'),
        ("assistant", '[Called function pay with args {"amount": 5}]'),
        ("user", result_as_content(s.calls["c4"])),
        ("assistant", "done")]
    assert json.dumps({"n": [1], "ok": True}) in turns[2][1] and "book" in turns[2][1]
    assert '"error": "card declined"' in turns[5][1] and "c4" in turns[5][1]


def test_a_handle_issued_before_the_seed_is_never_resumed():
    """A handle that may predate the seed (ev.HandleWithheld) is kept in the log but
    is no choice: the next session resumes from an older handle, or is fresh."""
    log = base()
    handle(log, "h1")
    log.add(ev.Disconnected(1, "error"), ev.Connected(2))  # fresh
    completed_call(log, gen=2)
    sent(log, gen=2, via="seed")
    log.add(ev.HandleWithheld(2, "h2-early"))
    s = log.state()
    assert "h2-early" not in s.handles
    assert choose_resumption(s, ALL, log.now_us) == "h1"
