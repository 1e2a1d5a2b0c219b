"""Seeding a fresh session, decided on the log (decide.SeedAsked, session_store.seeding):
what is seeded, whether the model is asked to answer it per generation, and whether a
session still awaits its seed (read from the fold, as a worker that takes over reads it);
replayed from the logged observation."""

from __future__ import annotations

import pytest

from session_store import events as ev
from session_store.audit.replay import logged_decisions, replay
from session_store.decide import SeedAsked, decide
from session_store.delivery import seed_plan
from session_store.models import rules_for
from session_store.observed import observation_record
from session_store.policy import Policy
from session_store.seeding import seed_answer_text, seed_turns

from .helpers import Log

ALL = Policy()
FRESH = Policy(resumption="avoid")
G25 = "models/gemini-2.5-flash-native-audio-preview-09-2025"
G31 = "gemini-3.1-flash-live-preview"
G38 = "gemini-3.8-live"
G38T = "gemini-3.8-live-extended-thinking"
GENERATIONS = [G25, G31, G38, G38T]


def call_on(model: str) -> Log:
    log = Log()
    log.add(ev.SessionOpened(model=model, tools=["lookup"], worker="w1", epoch=1),
            ev.ConversationMessage("user", "where is my order?", 0))
    return log


def answered_then_lost(model: str) -> Log:
    """A call whose one result a handle holds (a model took it in), then its session lost."""
    log = call_on(model)
    log.add(ev.Connected(1), ev.ToolCallRequested("c1", "lookup", {"q": 1}, 1),
            ev.ToolCallStarted("c1", 1, "call-1:c1", 1), ev.ToolCallCompleted("c1", {"ok": True}),
            ev.ToolResultSending("c1", 1, "tool_response"),
            ev.ToolResultSent("c1", 1, "tool_response"),
            ev.ConversationMessage("assistant", "It ships today.", 1),
            ev.HandleIssued(1, "h1"), ev.Disconnected(1, "error"), ev.Connected(2))
    return log


def observed(log: Log, obs, decided: list[ev.Event] | None = None) -> list[ev.Event]:
    """`obs` logged as the service logs it; `decided` in place of decide's (another shell)."""
    state = log.state()
    events = decide(state, obs, ALL) if decided is None else decided
    if events:
        log.add(observation_record(obs, events, state), *events)
    return events


def sending(events: list[ev.Event]) -> ev.ConversationSending:
    [found] = [e for e in events if isinstance(e, ev.ConversationSending)]
    return found


@pytest.mark.parametrize("model,recap", [(G25, True), (G31, False), (G38, False),
                                         (G38T, False)])
def test_after_a_reconnect_only_2_5_is_asked_to_recap(model, recap):
    log = answered_then_lost(model)
    assert seed_plan(log.state()).unanswered is False
    events = decide(log.state(), SeedAsked(2, for_reconnect=True), ALL)
    assert events == [ev.ToolResultSending("c1", 2, "seed"),
                      ev.ConversationSending(2, sending(events).through, "seed", recap)]


@pytest.mark.parametrize("model", GENERATIONS)
@pytest.mark.parametrize("asked", [True, False])
def test_on_the_first_connect_the_apps_setting_decides(model, asked):
    log = call_on(model)
    log.add(ev.Connected(1))
    events = decide(log.state(), SeedAsked(1, False, inference_on_context_init=asked), ALL)
    assert events == [ev.ConversationSending(1, 2, "seed", asked)]


@pytest.mark.parametrize("model", GENERATIONS)
def test_a_result_no_model_took_in_is_always_answered(model):
    log = answered_then_lost(model)
    log.events = [e for e in log.events if not isinstance(e, ev.HandleIssued)]
    log.times = log.times[:len(log.events)]
    assert seed_plan(log.state()).unanswered
    for for_reconnect in (True, False):
        assert sending(decide(log.state(), SeedAsked(2, for_reconnect), ALL)).answer


@pytest.mark.parametrize("model", GENERATIONS)
def test_a_resumed_session_or_nothing_to_seed_holds_all(model):
    log = call_on(model)
    log.events, log.times = log.events[:1], log.times[:1]  # no opening message
    log.add(ev.Connected(1))
    assert decide(log.state(), SeedAsked(1, False, True), ALL) == [ev.HoldsAll(1)]
    resumed = answered_then_lost(model)
    resumed.add(ev.Disconnected(2, "go_away"), ev.Connected(3, "h1"))
    assert decide(resumed.state(), SeedAsked(3, True), ALL) == [ev.HoldsAll(3)]


def test_one_seed_per_session_and_only_the_live_one():
    log = answered_then_lost(G31)
    assert decide(log.state(), SeedAsked(1, True), ALL) == []  # a session already left
    assert log.state().generations[2].seeded is False
    observed(log, SeedAsked(2, True))
    assert log.state().generations[2].seeded
    # pipecat asks again on its first context: nothing more is decided.
    assert decide(log.state(), SeedAsked(2, True), ALL) == []
    log.add(ev.Disconnected(2, "error"))
    assert decide(log.state(), SeedAsked(2, True), ALL) == []


def test_holding_all_marks_the_session_seeded_for_any_worker():
    log = call_on(G38)
    log.events, log.times = log.events[:1], log.times[:1]
    log.add(ev.Connected(1))
    assert not log.state().generations[1].seeded  # a fresh session awaits its seed
    observed(log, SeedAsked(1, False))
    log.add(ev.WorkerAttached("w2", 2))
    assert log.state().generations[1].seeded


@pytest.mark.parametrize("model,trailing,text", [(G25, True, False), (G31, False, True),
                                                 (G38, False, True), (G38T, False, True)])
def test_what_goes_out_is_shaped_by_the_generation(model, trailing, text):
    rules = rules_for(model)
    turns = [("user", "hi"), ("assistant", "hello")]
    shaped = seed_turns(turns, rules)
    assert shaped[:2] == [("user", "hi"), ("model", "hello")]
    assert shaped[2:] == ([("user", " ")] if trailing else [])
    assert seed_turns([("user", "hi")], rules) == [("user", "hi")]
    assert seed_answer_text(rules, True) == (" " if text else None)
    assert seed_answer_text(rules, False) is None


def test_the_seed_is_replayed_and_a_shell_that_asked_otherwise_diverges():
    log = answered_then_lost(G25)
    observed(log, SeedAsked(2, for_reconnect=True))
    records = log.records()
    n = len(list(logged_decisions(records)))
    report = replay(records, FRESH)  # (the hand-built log starts its sessions fresh)
    assert report.ok and report.coverage.startswith(f"{n} of {n} decisions replayed"), report
    # A shell that did not ask 2.5 to recap after the reconnect: replay names that decision.
    other = answered_then_lost(G25)
    decided = decide(other.state(), SeedAsked(2, for_reconnect=True), ALL)
    flipped = [ev.ConversationSending(e.generation, e.through, e.via, not e.answer)
               if isinstance(e, ev.ConversationSending) else e for e in decided]
    at = observed(other, SeedAsked(2, for_reconnect=True), flipped)
    [wrong] = replay(other.records(), FRESH).divergences
    assert wrong.kind == "decide" and wrong.version == other.version - len(at) + 1
    assert wrong.observation["observation"] == "SeedAsked", wrong.observation
