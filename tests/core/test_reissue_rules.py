"""Equal calls, re-asked calls and cancellations, and a reconnect asked for mid-handshake:
the pure decisions (decide.py, projection.py) against the delivery rules (DESIGN.md).

Each test is a concrete sequence of wire events folded as the service logs them; each failed
on the code before 2026-12-02 (found by review). Pure: hand-built streams, no I/O.
"""

from __future__ import annotations

import hashlib

from session_store import events as ev
from session_store.decide import (CancellationArrived, FunctionCall, SettingsUpdate, SpeechStopped,
                                  ToolCallsArrived, cancelled_with, decide, find_equivalent)
from session_store.delivery import Reconnect, SendResult, StartCall, due, unanswered
from session_store.lineage import in_model
from session_store.policy import Policy

from .helpers import Log, opened

ALL = Policy()


def live() -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1))
    return log


def observe(log: Log, obs) -> list[ev.Event]:
    out = decide(log.state(), obs, ALL)
    log.add(*out)
    return out


def sends(effects) -> list[SendResult]:
    return [e for e in effects if isinstance(e, SendResult)]


def _two_equal_calls_in_one_session() -> Log:
    """Generation 1 (never reconnected) asks for get_weather(Paris) while the bot speaks
    (c1, deferred), then, in a second toolCall message of the same session, for the same
    function with the same arguments (c2), e.g. two parallel calls Gemini sent as two
    messages. The session issued both ids and waits for both answers."""
    log = live()
    log.add(ev.BotStartedSpeaking(1))
    observe(log, ToolCallsArrived((FunctionCall("c1", "get_weather", {"city": "Paris"}),), 1))
    observe(log, ToolCallsArrived((FunctionCall("c2", "get_weather", {"city": "Paris"}),), 1))
    return log


def test_an_equal_call_in_the_same_session_leaves_the_first_id_unanswered():
    """Nothing was lost (no reconnect, no resume, no crash): c1 is not a call 'whose answer
    the model's state lost', yet find_equivalent links c2 to it (ToolCallReissued) because
    c1's answer is simply not sent *yet*. c1 is then superseded and never answered, although
    the live session issued it and waits for its toolResponse."""
    log = _two_equal_calls_in_one_session()
    s = log.state()
    assert s.calls["c1"].superseded_by is None, (
        "c2 was linked to c1 although the live session still knows c1 and awaits it "
        f"(c1.superseded_by={s.calls['c1'].superseded_by!r}, c2.status={s.calls['c2'].status!r})")


def test_an_equal_call_in_the_same_session_gets_both_ids_answered():
    log = _two_equal_calls_in_one_session()
    observe(log, SpeechStopped(1))
    for e in due(log.state(), ALL, log.now_us):
        if isinstance(e, StartCall):
            log.add(ev.ToolCallStarted(e.call_id, e.attempt, e.idempotency_key, 1))
    for cid in [c.call_id for c in log.state().calls.values() if c.status == "started"]:
        log.add(ev.ToolCallCompleted(cid, {"temp": 21}))
    s = log.state()
    out = sends(due(s, ALL, log.now_us))
    # Both ids were issued by the live session: each must get its toolResponse.
    assert SendResult("c1", "tool_response") in out, (
        f"c1, issued by the live session, is never answered: due sends only {out}; "
        f"unanswered per the log: {[c.call_id for c in unanswered(s)]}")
    assert SendResult("c2", "tool_response") in out


def test_cancelling_the_first_of_two_equal_calls_leaves_the_second_waiting_for_ever():
    """Same session: c1 deferred, c2 (equal) linked to it, then Gemini cancels c1
    (toolCallCancellation, e.g. a barge-in). c2 was never cancelled and still needs an
    answer, but it is 'awaiting' c1's outcome, which never comes: nothing is ever due for it
    and the model waits for c2 for ever."""
    log = _two_equal_calls_in_one_session()
    observe(log, CancellationArrived(("c1",), 1))
    observe(log, SpeechStopped(1))
    s = log.state()
    assert s.calls["c1"].status == "cancelled"
    effects = due(s, ALL, log.now_us)
    c2_effects = [e for e in effects if getattr(e, "call_id", None) == "c2"]
    assert c2_effects or s.calls["c2"].has_outcome, (
        f"c2 is stuck: status {s.calls['c2'].status!r}, nothing due for it ({effects}), "
        f"unanswered {[c.call_id for c in unanswered(s)]}")


def test_an_answer_reused_from_the_record_is_not_also_sent_under_the_original_id():
    """c1 answered on generation 1; generation 2 resumes from a handle older than c1 (the
    model lost c1 and its answer) and asks again (c2) before c1's answer went in as
    content. decide answers c2 from the record (ToolCallCompleted reused_from=c1) but, unlike
    the ToolCallReissued path, does not mark c1 superseded: `due` then sends the same single
    execution's result twice into generation 2 (c1 as content AND c2 as toolResponse)."""
    log = live()
    log.add(ev.HandleIssued(1, "h0"))
    log.add(ev.ToolCallRequested("c1", "lookup", {"q": 1}, 1),
            ev.ToolCallStarted("c1", 1, "k", 1), ev.ToolCallCompleted("c1", {"temp": 21}),
            ev.ToolResultSending("c1", 1, "tool_response"),
            ev.ToolResultSent("c1", 1, "tool_response"))
    log.add(ev.Disconnected(1, "go_away"), ev.Connected(2, handle="h0"))
    out = observe(log, ToolCallsArrived((FunctionCall("c2", "lookup", {"q": 1}),), 2))
    assert ev.ToolCallCompleted("c2", {"temp": 21}, reused_from="c1") in out
    got = sends(due(log.state(), ALL, log.now_us))
    assert got == [SendResult("c2", "tool_response")], (
        f"one tool execution's result goes into generation 2 twice: {got}")


def test_a_prompt_change_logged_during_a_reconnect_handshake_is_not_dropped():
    """A goAway reconnect is under way: Disconnected(1) is logged and the shell has already
    captured the prompt for the new session (_replace_session copies
    settings.system_instruction into _system_instruction_from_init before _disconnect/_connect).
    The app now changes the prompt: SettingsChanged + ReconnectRequested are logged while
    the handshake runs. The new session comes up with the OLD prompt (its Connected even
    records the old prompt's sha256), and Connected clears reconnect_pending, so the new
    prompt is never applied to any session."""
    old, new = "Be brief.", "Speak French."
    log = Log()
    log.add(ev.SessionOpened("m", ["lookup"], "w1", 1, {"system_instruction": old}),
            ev.Connected(1, system_instruction_sha256=hashlib.sha256(old.encode()).hexdigest()))
    log.add(ev.GoAwayReceived(1, 3.0), ev.Disconnected(1, "go_away"))
    observe(log, decide_settings(new))
    assert log.state().reconnect_pending == "settings"
    log.add(ev.Connected(2, system_instruction_sha256=hashlib.sha256(old.encode()).hexdigest()))
    s = log.state()
    assert s.settings["system_instruction"] == new
    assert Reconnect("settings") in due(s, ALL, log.now_us), (
        "generation 2 runs the old prompt (its Connected says so) and nothing will ever "
        f"reconnect to apply the new one: reconnect_pending={s.reconnect_pending!r}")


def decide_settings(prompt: str):
    return SettingsUpdate(("system_instruction",), {"system_instruction": prompt})


def test_a_cancelled_reissue_does_not_start_its_deferred_original():
    """Gen 1 asks for c1 while the bot speaks (deferred). A goAway deadline reconnect cuts
    the turn (the transport still plays, so c1 stays deferred); gen 2 resumes from h0, a
    handle older than c1, so the model has lost c1 and asks again: c2, equal, linked to c1
    (ToolCallReissued: 'the original never runs twice'). The user barges in and Gemini
    cancels c2 (toolCallCancellation) — the only id the model still has for this request.
    The cancellation is not carried over to c1: when the bot stops, the deferred original
    c1 starts, and the tool runs although the model cancelled it (its result then goes
    nowhere: c1 is superseded and c2 cancelled)."""
    log = live()
    log.add(ev.HandleIssued(1, "h0"), ev.BotStartedSpeaking(1))
    observe(log, ToolCallsArrived((FunctionCall("c1", "lookup", {"order": 7}),), 1))
    assert log.state().calls["c1"].status == "deferred"
    log.add(ev.GoAwayReceived(1, 1.0), ev.Disconnected(1, "go_away"),
            ev.BotStartedSpeaking(1, "transport"), ev.Connected(2, handle="h0"),
            ev.BotStartedSpeaking(2, "transport"))
    observe(log, ToolCallsArrived((FunctionCall("c2", "lookup", {"order": 7}),), 2))
    assert log.state().calls["c2"].reissue_of == "c1"
    observe(log, CancellationArrived(("c2",), 2))
    from session_store.decide import InterruptionObserved
    observe(log, InterruptionObserved(2))
    s = log.state()
    assert s.calls["c2"].status == "cancelled"
    starts = [e for e in due(s, ALL, log.now_us) if isinstance(e, StartCall)]
    assert starts == [], (
        f"the model cancelled the request (c2), yet its deferred original starts: {starts}")


def test_a_cancelled_reissue_cancels_its_running_original_too():
    """As above, but the original was already running when the model lost it: the log
    cancels it with the re-issue (the service stops its task, `cancelled_with`), and its
    result, when the task ends anyway, is owed to nobody."""
    log = live()
    log.add(ev.HandleIssued(1, "h0"))
    observe(log, ToolCallsArrived((FunctionCall("c1", "lookup", {"order": 7}),), 1))
    log.add(ev.ToolCallStarted("c1", 1, "k", 1))
    log.add(ev.Disconnected(1, "error"), ev.Connected(2, handle="h0"))
    observe(log, ToolCallsArrived((FunctionCall("c2", "lookup", {"order": 7}),), 2))
    s = log.state()
    assert s.calls["c2"].reissue_of == "c1"
    assert [c.call_id for c in cancelled_with(s, ("c2",))] == ["c2", "c1"]
    out = observe(log, CancellationArrived(("c2",), 2))
    assert out == [ev.ToolCallCancelled("c2", "server"),
                   ev.ToolCallCancelled("c1", "reissue_cancelled")]
    log.add(ev.ToolCallCompleted("c1", {"late": True}))
    s = log.state()
    assert sends(due(s, ALL, log.now_us)) == []
    assert unanswered(s) == []


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_prompt_change_during_the_first_handshake_stays_pending():
    """setup() opens the first session at once (pipecat's setup -> _connect builds its
    config, with the prompt, before the handshake). The app's first frames (a prompt change)
    are processed while that handshake runs: the change is logged between session.opened
    and the first connection.connected, whose sha256 is the OLD prompt. The reconnect stays
    pending past it, as after any handshake."""
    old, new = "Be brief.", "Speak French."
    log = Log()
    log.add(ev.SessionOpened("m", ["lookup"], "w1", 1, {"system_instruction": old}))
    log.add(*decide(log.state(), SettingsUpdate(("system_instruction",),
                                                {"system_instruction": new}), ALL))
    assert log.state().reconnect_pending == "settings"
    log.add(ev.Connected(1, system_instruction_sha256=sha(old)))
    s = log.state()
    assert s.settings["system_instruction"] == new
    assert Reconnect("settings") in due(s, ALL, log.now_us), (
        "generation 1 runs the old prompt (its Connected says so) and nothing will ever "
        f"reconnect to apply the new one: reconnect_pending={s.reconnect_pending!r}")


def test_a_request_equal_to_a_cancelled_call_runs_anew_and_is_answered():
    """Gen 1 asks for c1; Gemini cancels it before it starts (the user barged in). The
    session is lost; gen 2 resumes from h0, a handle older than c1, and the model asks for
    the same thing again: c2, equal to c1. c1 is no answer to wait for (cancelled: it never
    runs and has no outcome, or one owed to nobody), so c2 is a request of its own: it runs
    and is answered. Linked to c1 instead (find_equivalent taking a cancelled call for the
    original), c2 would wait for an outcome that never comes (I1). (Found by mutation
    testing: no test covered the cancelled case of find_equivalent.)"""
    log = live()
    log.add(ev.HandleIssued(1, "h0"), ev.BotStartedSpeaking(1))
    observe(log, ToolCallsArrived((FunctionCall("c1", "lookup", {"order": 7}),), 1))
    observe(log, CancellationArrived(("c1",), 1))
    assert log.state().calls["c1"].status == "cancelled"
    log.add(ev.BotStoppedSpeaking(1), ev.Disconnected(1, "error"), ev.Connected(2, handle="h0"))
    s = log.state()
    assert find_equivalent(s, "lookup", {"order": 7}, 10_000_000) is None
    out = observe(log, ToolCallsArrived((FunctionCall("c2", "lookup", {"order": 7}),), 2))
    assert out == [ev.ToolCallRequested("c2", "lookup", {"order": 7}, 2)], out
    s = log.state()
    assert s.calls["c2"].reissue_of is None and s.calls["c1"].superseded_by is None
    starts = [e for e in due(s, ALL, log.now_us) if isinstance(e, StartCall)]
    assert [e.call_id for e in starts] == ["c2"], starts
    log.add(ev.ToolCallStarted("c2", 1, starts[0].idempotency_key, 1),
            ev.ToolCallCompleted("c2", {"status": "shipped"}))
    s = log.state()
    assert sends(due(s, ALL, log.now_us)) == [SendResult("c2", "tool_response")]


def _answered_as_content_on_a_resumed_session() -> Log:
    """c1 (gen 1) completes; the session is lost before its answer; gen 2 resumes from h0,
    older than c1, so c1's result goes in as content (ToolResultSent via content)."""
    log = live()
    log.add(ev.HandleIssued(1, "h0"))
    observe(log, ToolCallsArrived((FunctionCall("c1", "lookup", {"order": 7}),), 1))
    log.add(ev.ToolCallStarted("c1", 1, "k", 1), ev.Disconnected(1, "error"),
            ev.ToolCallCompleted("c1", {"status": "shipped"}), ev.Connected(2, handle="h0"))
    assert sends(due(log.state(), ALL, log.now_us)) == [SendResult("c1", "content")]
    log.add(ev.ToolResultSending("c1", 2, "content"), ev.ToolResultSent("c1", 2, "content"))
    return log


def test_a_re_ask_that_crossed_a_content_answer_is_answered_from_the_record():
    """Gemini asks again for c1's request (c3, equal) right after c1's answer went in as
    content: the request crossed the answer on the wire (the model asked before it read
    it). Within the crossing window c3 is answered from the record and the tool never runs
    twice (I3); the crash harness found the double run. (Mutation testing: `_crossed`
    returning False was caught only by one case of the full crash sweep.)"""
    log = _answered_as_content_on_a_resumed_session()
    assert in_model(log.state(), log.state().calls["c1"])
    out = observe(log, ToolCallsArrived((FunctionCall("c3", "lookup", {"order": 7}),), 2))
    assert out == [ev.ToolCallRequested("c3", "lookup", {"order": 7}, 2),
                   ev.ToolCallCompleted("c3", {"status": "shipped"}, reused_from="c1")], out
    s = log.state()
    assert [e for e in due(s, ALL, log.now_us) if isinstance(e, StartCall)] == []
    assert sends(due(s, ALL, log.now_us)) == [SendResult("c3", "tool_response")]


def test_an_equal_request_long_after_a_content_answer_is_a_request_of_its_own():
    """The same, but past the crossing window: the model had the answer and asks again
    (the user wants a fresh lookup): c3 runs."""
    log = _answered_as_content_on_a_resumed_session()
    log.add(ev.ConversationMessage("user", "and again?", 2),
            at_us=log.now_us + int(ALL.crossing_window_s * 1e6) + 1_000_000)
    out = observe(log, ToolCallsArrived((FunctionCall("c3", "lookup", {"order": 7}),), 2))
    assert out == [ev.ToolCallRequested("c3", "lookup", {"order": 7}, 2)], out
    s = log.state()
    assert [e.call_id for e in due(s, ALL, log.now_us) if isinstance(e, StartCall)] == ["c3"]


def test_a_call_re_asked_twice_is_answered_through_the_newest_id():
    """Generation 1 asks for c1 and it starts; a fresh session (2) re-asks for it as c2
    (linked, awaiting), and another fresh session (3) re-asks again as c3 (linked to c2).
    When c1 completes, the outcome passes down the whole chain: c3, the only id the live
    session knows, is answered. (Passed only one link down, c3 stayed "awaiting" for ever:
    I1.)"""
    log = live()
    observe(log, ToolCallsArrived((FunctionCall("c1", "lookup", {"q": 1}),), 1))
    log.add(ev.ToolCallStarted("c1", 1, "call-1:c1", 1))
    for gen, cid in ((2, "c2"), (3, "c3")):
        log.add(ev.Disconnected(gen - 1, "error"), ev.Connected(gen))
        assert observe(log, ToolCallsArrived((FunctionCall(cid, "lookup", {"q": 1}),), gen)) \
            == [ev.ToolCallRequested(cid, "lookup", {"q": 1}, gen),
                ev.ToolCallReissued(cid, f"c{gen - 1}")]
    log.add(ev.ToolCallCompleted("c1", {"answer": 42}))
    s = log.state()
    assert (s.calls["c3"].status, s.calls["c3"].result) == ("completed", {"answer": 42})
    assert sends(due(s, ALL, log.now_us)) == [SendResult("c3", "tool_response")]
    assert [c.call_id for c in unanswered(s)] == ["c1", "c2", "c3"]


def test_a_re_ask_for_a_failed_call_is_answered_with_its_failure():
    """c1 failed (the tool raised) and the session was lost before the failure reached the
    model; the fresh session re-asks (c2). The tool does not run again, and c2 gets c1's
    failure, not a success with no result."""
    log = live()
    observe(log, ToolCallsArrived((FunctionCall("c1", "lookup", {"order": 7}),), 1))
    log.add(ev.ToolCallStarted("c1", 1, "k", 1), ev.ToolCallFailed("c1", "boom"),
            ev.Disconnected(1, "error"), ev.Connected(2))
    out = observe(log, ToolCallsArrived((FunctionCall("c2", "lookup", {"order": 7}),), 2))
    assert out == [ev.ToolCallRequested("c2", "lookup", {"order": 7}, 2),
                   ev.ToolCallReissued("c2", "c1")], out
    c2 = log.state().calls["c2"]
    assert (c2.status, c2.error, c2.result) == ("failed", "boom", None)
    effects = due(log.state(), ALL, log.now_us)
    assert [e for e in effects if isinstance(e, StartCall)] == []
    assert sends(effects) == [SendResult("c2", "tool_response")]


def test_cancelling_a_re_ask_leaves_its_answered_original_alone():
    """c1 was running when a fresh session re-asked for it (c2, linked); c1 then completed and
    c2 took its result. Gemini now cancels c2: only c2 is cancelled. c1 keeps its result (it
    ran; the log says so, and a later fresh session's history holds it once), instead of
    being recorded as cancelled ("reissue_cancelled") after it finished."""
    log = live()
    observe(log, ToolCallsArrived((FunctionCall("c1", "lookup", {"order": 7}),), 1))
    log.add(ev.ToolCallStarted("c1", 1, "k", 1), ev.Disconnected(1, "error"), ev.Connected(2))
    assert observe(log, ToolCallsArrived((FunctionCall("c2", "lookup", {"order": 7}),), 2))[1] \
        == ev.ToolCallReissued("c2", "c1")
    log.add(ev.ToolCallCompleted("c1", {"status": "shipped"}))
    assert log.state().calls["c2"].status == "completed"
    assert observe(log, CancellationArrived(("c2",), 2)) == [ev.ToolCallCancelled("c2", "server")]
    s = log.state()
    assert (s.calls["c1"].status, s.calls["c1"].result) == ("completed", {"status": "shipped"})
    assert sends(due(s, ALL, log.now_us)) == [] and unanswered(s) == []
