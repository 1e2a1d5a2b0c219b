"""Decisions the service used to make in its shell, now pure: which handles are withheld
(session_store.withholding), the answer owed for a call stopped without a result, a result
kept while the log was down, an intermediate result's part number, and the transport's
speech carried across a new or closed session. Hand-built streams, no I/O."""

from __future__ import annotations

from session_store import events as ev
from session_store.answers import (STOPPED_ERROR, cancelled_on_wire, next_progress,
                                   stopped_failure, unless_answered)
from session_store.decide import SessionLeft, SessionReady, decide
from session_store.policy import Policy
from session_store.withholding import HandleGate, Incoming

from .helpers import Log, opened

ALL = Policy()


def running(*call_ids: str) -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1))
    for cid in call_ids:
        log.add(ev.ToolCallRequested(cid, "lookup", {}, 1), ev.ToolCallStarted(cid, 1, cid, 1))
    return log


# --------------------------------------------------------------------------- handles

def test_a_session_that_holds_all_it_was_told_issues_its_handles():
    gate = HandleGate()
    gate.holds_everything(1)
    assert gate.receive(Incoming(1, "h1", 3)) == ev.HandleIssued(1, "h1", 3)


def test_handles_after_a_send_are_withheld_until_the_model_reacts():
    gate = HandleGate()
    gate.holds_everything(1)
    gate.sending(1, model_generating=False)
    assert gate.receive(Incoming(1, "h1")) == ev.HandleWithheld(1, "h1")
    assert gate.receive(Incoming(1, reaction=True)) is None
    assert gate.receive(Incoming(1, "h2", 7)) == ev.HandleIssued(1, "h2", 7)


def test_a_turn_under_way_at_the_send_must_end_before_a_reaction_counts():
    gate = HandleGate()
    gate.sending(1, model_generating=True)
    gate.receive(Incoming(1, reaction=True))  # output of the turn begun before the send
    assert gate.receive(Incoming(1, "h1")) == ev.HandleWithheld(1, "h1")
    gate.receive(Incoming(1, reaction=True, turn_ended=True))  # that turn is over
    assert gate.receive(Incoming(1, "h2")) == ev.HandleWithheld(1, "h2")
    gate.receive(Incoming(1, reaction=True))  # the next turn reacts to the send
    assert gate.receive(Incoming(1, "h3")) == ev.HandleIssued(1, "h3", None)


def test_a_send_on_another_session_is_not_this_ones():
    gate = HandleGate()
    gate.sending(1, model_generating=False)
    gate.holds_everything(2)
    assert gate.receive(Incoming(2, reaction=True)) is None
    assert gate.receive(Incoming(2, "h")) == ev.HandleIssued(2, "h", None)
    assert gate.receive(Incoming(1, "old")) == ev.HandleWithheld(1, "old")


# --------------------------------------------------------------------------- results

def test_a_stopped_call_is_owed_an_explicit_failure():
    state = running("c1").state()
    assert stopped_failure(state, "c1", set()) == [
        ev.ToolCallFailed("c1", STOPPED_ERROR, outcome_unknown=True)]


def test_nothing_is_owed_for_a_call_gemini_cancelled_or_that_has_its_outcome():
    log = running("c1", "c2")
    log.add(ev.ToolCallCompleted("c2", {"ok": True}))
    state = log.state()
    assert stopped_failure(state, "c1", {"c1"}) == []  # cancelled on the wire
    assert stopped_failure(state, "c2", set()) == []  # answered already
    assert stopped_failure(state, "nope", set()) == []


def test_a_cancellation_of_the_id_that_re_asked_reaches_the_original():
    log = running("c1")
    state = log.state()
    state.calls["c1"].superseded_by = "c2"
    assert cancelled_on_wire(state, "c1", {"c2"})
    assert not cancelled_on_wire(state, "c1", {"c3"})


def test_a_kept_result_is_logged_unless_the_call_was_answered_meanwhile():
    log = running("c1")
    outcome = [ev.ToolCallCompleted("c1", {"ok": 1})]
    assert unless_answered(log.state(), "c1", outcome) == outcome
    log.add(*outcome)  # the failed append committed after all
    assert unless_answered(log.state(), "c1", outcome) == []


def test_intermediate_results_are_numbered_in_order_until_the_outcome():
    log = running("c1")
    first = next_progress(log.state(), "c1", {"p": 1}, "SILENT")
    assert first == [ev.ToolCallProgress("c1", 1, {"p": 1}, "SILENT")]
    log.add(*first)
    assert next_progress(log.state(), "c1", {"p": 2}, None) == [
        ev.ToolCallProgress("c1", 2, {"p": 2}, None)]
    log.add(ev.ToolCallCompleted("c1", {"done": True}))
    assert next_progress(log.state(), "c1", {"p": 3}, None) == []


# --------------------------------------------------------------------------- sessions

def test_the_transport_still_playing_is_speech_on_the_next_session():
    log = Log()
    log.add(opened())
    assert decide(log.state(), SessionReady(1, None, "sha", transport_playing=False), ALL) == [
        ev.Connected(1, None, "sha")]
    assert decide(log.state(), SessionReady(1, "h", "sha", transport_playing=True), ALL) == [
        ev.Connected(1, "h", "sha"), ev.BotStartedSpeaking(1, "transport")]


def test_leaving_a_session_while_the_transport_plays_keeps_the_bot_speaking():
    log = Log()
    log.add(opened(), ev.Connected(1))
    assert decide(log.state(), SessionLeft(1, "go_away", transport_playing=True), ALL) == [
        ev.Disconnected(1, "go_away"), ev.BotStartedSpeaking(1, "transport")]
    log.add(ev.Disconnected(1, "error"))
    assert decide(log.state(), SessionLeft(1, "error"), ALL) == []  # nothing live to leave
