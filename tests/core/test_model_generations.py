"""The decisions that differ by Gemini Live model generation, on hand-built streams (pure):
how a result goes to a session that never issued its call, NON_BLOCKING calls (deferral,
intermediate results, scheduling), interaction status, in-session context updates, what a
resumed session lacks (settings and turns), and the Policy's resumption choice."""

from __future__ import annotations

import pytest

from session_store import events as ev
from session_store.audit import replay
from session_store.decide import (FunctionCall, InteractionStatusObserved, SettingsUpdate,
                                  ToolCallsArrived, decide)
from session_store.delivery import (ApplyContext, Reconnect, SendConversation, SendResult,
                                    StartCall, catch_up_turns, choose_resumption, due,
                                    lacks_context, result_as_content, result_scheduling, seed_plan,
                                    undelivered_parts, waits_for_idle)
from session_store.policy import Policy
from session_store.models import call_mode, family, rules_for
from session_store.compaction import compact
from session_store.lineage import unheld_messages

from .helpers import Log

G25 = "models/gemini-2.5-flash-native-audio-preview-09-2025"
G31 = "gemini-3.1-flash-live-preview"
G38 = "gemini-3.8-live"
G38T = "gemini-3.8-live-extended-thinking"
ALL = Policy()


def live(model: str, speaking: bool = False) -> Log:
    log = Log()
    log.add(ev.SessionOpened(model=model, tools=["lookup", "book"], worker="w1", epoch=1,
                             settings={"model": model, "system_instruction": "Be brief."}),
            ev.Connected(1))
    if speaking:
        log.add(ev.BotStartedSpeaking(1))
    return log


def observe(log: Log, obs, policy: Policy = ALL) -> list[ev.Event]:
    out = decide(log.state(), obs, policy)
    if out:
        log.add(*out)
    return out


def arrive(log: Log, call_id: str, declared: str | None = None, name: str = "lookup"):
    return observe(log, ToolCallsArrived((FunctionCall(call_id, name, {}, declared=declared),),
                                         log.state().generation))


def effects(log: Log, policy: Policy = ALL):
    return due(log.state(), policy, log.now_us)


# --------------------------------------------------------------------------- the rules

@pytest.mark.parametrize("model, expected", [
    (G25, "2.5"), ("gemini-live-2.5-flash-preview", "2.5"), ("gemini-2.0-flash-live-001", "2.5"),
    ("gemini-live", "2.5"), (f"models/{G31}", "3.1"), ("gemini-3.0-live", "3.1"),
    (G38, "3.8"), (f"models/{G38T}", "3.8-thinking"), ("gemini-4-live", "3.8"),
    ("gemini-2.5-flash-exp-native-audio-thinking-dialog", "2.5"),
])
def test_each_model_id_has_its_generation(model, expected):
    assert family(model) == expected


@pytest.mark.parametrize("model, declared, mode", [
    (G25, None, "blocking"), (G25, "NON_BLOCKING", "non_blocking"), (G31, None, "blocking"),
    (G31, "NON_BLOCKING", "blocking"),  # 3.1 has no NON_BLOCKING declarations
    (G38, None, "non_blocking"), (G38, "BLOCKING", "blocking"),
    (G38T, None, "non_blocking"), (G38T, "BLOCKING", "non_blocking"),  # thinking: only async
])
def test_call_mode_follows_the_declaration_and_the_generation(model, declared, mode):
    assert call_mode(rules_for(model), declared) == mode


# --------------------------------------------------------------------------- results as content

@pytest.mark.parametrize("model, via", [(G25, "content"), (G31, "text"), (G38, "text"),
                                        (G38T, "text")])
def test_a_result_for_a_call_the_session_never_issued_goes_by_the_generations_channel(
        model, via):
    log = live(model)
    arrive(log, "c1", declared="BLOCKING" if model == G38 else None)
    log.add(ev.ToolCallStarted("c1", 1, "k", 1), ev.ToolCallCompleted("c1", {"ok": 1}),
            ev.Disconnected(1, "error"), ev.Connected(2))  # fresh: it never issued c1
    assert effects(log) == [SendResult("c1", via)]
    log.add(ev.BotStartedSpeaking(2))
    assert effects(log) == []  # content or text: waits for silence, as a deferred call does


def test_a_result_for_the_session_that_asked_goes_as_a_tool_response_on_every_generation():
    for model in (G25, G31, G38, G38T):
        log = live(model)
        arrive(log, "c1")
        log.add(ev.ToolCallStarted("c1", 1, "k", 1), ev.ToolCallCompleted("c1", {"ok": 1}))
        assert effects(log) == [SendResult("c1", "tool_response")], model


# --------------------------------------------------------------------------- NON_BLOCKING calls

def test_a_non_blocking_call_starts_while_the_bot_speaks_unless_the_policy_defers_it():
    log = live(G38, speaking=True)
    out = arrive(log, "c1")
    assert out == [ev.ToolCallRequested("c1", "lookup", {}, 1, "non_blocking", None)]
    assert effects(log) == [StartCall("c1", 1, "call-1:c1")]
    held = Policy(defer_non_blocking=True)
    log2 = live(G38, speaking=True)
    assert observe(log2, ToolCallsArrived((FunctionCall("c1", "lookup", {}),), 1), held)[-1] \
        == ev.ToolCallDeferred("c1")
    # A blocking call on the same model is deferred as before.
    log3 = live(G38, speaking=True)
    assert arrive(log3, "c1", declared="BLOCKING")[-1] == ev.ToolCallDeferred("c1")


def non_blocking_running(model: str = G38) -> Log:
    log = live(model)
    arrive(log, "c1")
    log.add(ev.ToolCallStarted("c1", 1, "call-1:c1", 1))
    return log


def test_intermediate_results_go_in_order_each_once_then_the_outcome_closes_the_call():
    log = non_blocking_running()
    log.add(ev.ToolCallProgress("c1", 1, {"step": 1}, "SILENT"),
            ev.ToolCallProgress("c1", 2, {"step": 2}, "WHEN_IDLE"))
    assert effects(log) == [SendResult("c1", "tool_response", 1)]  # one part at a time
    log.add(ev.ToolResultSending("c1", 1, "tool_response", 1))
    assert effects(log) == []  # part 1 on its way: part 2 waits
    log.add(ev.ToolResultSent("c1", 1, "tool_response", 1))
    assert effects(log) == [SendResult("c1", "tool_response", 2)]
    log.add(ev.ToolResultSending("c1", 1, "tool_response", 2),
            ev.ToolResultSent("c1", 1, "tool_response", 2),
            ev.ToolCallCompleted("c1", {"done": True}, scheduling="WHEN_IDLE"))
    assert effects(log) == [SendResult("c1", "tool_response")]
    call = log.state().calls["c1"]
    assert [result_scheduling(call, p) for p in (1, 2, 0)] == ["SILENT", "WHEN_IDLE",
                                                                "WHEN_IDLE"]
    log.add(ev.ToolResultSending("c1", 1, "tool_response"),
            ev.ToolResultSent("c1", 1, "tool_response"))
    assert effects(log) == [] and not undelivered_parts(log.state())


def test_a_session_resumed_before_an_intermediate_result_gets_it_again_and_only_it():
    log = non_blocking_running()
    log.add(ev.ToolCallProgress("c1", 1, {"step": 1}),
            ev.ToolResultSending("c1", 1, "tool_response", 1),
            ev.ToolResultSent("c1", 1, "tool_response", 1),
            ev.HandleIssued(1, "h1"),  # NON_BLOCKING: a handle while the call is open
            ev.ToolCallProgress("c1", 2, {"step": 2}),
            ev.ToolResultSending("c1", 1, "tool_response", 2),
            ev.ToolResultSent("c1", 1, "tool_response", 2),
            ev.Disconnected(1, "go_away"))
    state = log.state()
    assert choose_resumption(state, ALL, log.now_us) == "h1"
    log.add(ev.Connected(2, "h1"))
    # The resumed state issued c1 (before h1) and holds part 1: part 2 goes as a response.
    assert effects(log) == [SendResult("c1", "tool_response", 2)]


def test_the_outcome_of_a_call_the_session_does_not_know_goes_as_text_after_its_progress():
    log = non_blocking_running()
    log.add(ev.ToolCallProgress("c1", 1, {"step": 1}), ev.Disconnected(1, "error"),
            ev.Connected(2), ev.ToolCallCompleted("c1", {"done": True}))
    assert effects(log) == [SendResult("c1", "text", 1)]
    call = log.state().calls["c1"]
    assert result_as_content(call, 1) == \
        '[Function lookup (call_id c1) reported progress {"step": 1}]'


def test_a_seed_carries_a_running_calls_progress_and_a_finished_calls_outcome_only():
    log = non_blocking_running()
    log.add(ev.ToolCallProgress("c1", 1, {"step": 1}))
    arrive(log, "c2")
    log.add(ev.ToolCallStarted("c2", 1, "k", 1), ev.ToolCallProgress("c2", 1, {"step": 1}),
            ev.ToolCallCompleted("c2", {"done": 2}))
    plan = seed_plan(log.state())
    assert plan.parts == [("c1", 1), ("c2", 0)]
    assert plan.turns[1] == ("user", '[Function lookup (call_id c1) reported progress '
                                     '{"step": 1}]')
    assert plan.turns[-1][1].startswith("[Function lookup (call_id c2) returned")


def test_an_intermediate_result_out_of_order_is_a_corrupt_log():
    log = non_blocking_running()
    log.add(ev.ToolCallProgress("c1", 2, {"step": 2}))
    with pytest.raises(Exception, match="intermediate result 2"):
        log.state()


# --------------------------------------------------------------------------- interaction status

def test_on_a_thinking_model_a_reconnect_waits_for_idle_not_for_silence():
    log = live(G38T)
    observe(log, InteractionStatusObserved(1, "IN_PROGRESS"))
    assert observe(log, InteractionStatusObserved(1, "IN_PROGRESS")) == []  # changes only
    observe(log, SettingsUpdate(("voice",), {"voice": "Puck"}))
    assert not log.state().bot_speaking
    assert effects(log) == [] and waits_for_idle(log.state())
    assert observe(log, InteractionStatusObserved(1, "IDLE")) == [
        ev.InteractionStatus(1, "IDLE", "server")]
    assert effects(log) == [Reconnect("settings")]


def test_interaction_status_is_not_logged_for_models_that_do_not_report_it():
    log = live(G38)
    assert observe(log, InteractionStatusObserved(1, "IN_PROGRESS")) == []


def test_a_go_away_deadline_reconnects_a_model_still_in_progress():
    log = live(G38T)
    observe(log, InteractionStatusObserved(1, "IN_PROGRESS"))
    log.add(ev.GoAwayReceived(1, 6.0))
    assert effects(log) == []
    assert due(log.state(), ALL, log.now_us + 2_000_000) == [Reconnect("go_away")]


# --------------------------------------------------------------------------- context updates

def test_a_prompt_change_on_3_8_goes_in_session_once_and_again_after_an_older_resume():
    log = live(G38)
    log.add(ev.HandleIssued(1, "h-old"))
    out = observe(log, SettingsUpdate(("system_instruction",), {"system_instruction": "New."}))
    assert out == [ev.SettingsChanged(["system_instruction"], {"system_instruction": "New."},
                                      False, True)]
    changed = log.version
    assert effects(log) == [ApplyContext(changed)]
    log.add(ev.ContextSending(1, changed))
    assert effects(log) == []  # under way on this session
    log.add(ev.ContextSent(1, changed), ev.HandleIssued(1, "h-new"))
    assert effects(log) == [] and not lacks_context(log.state())
    # Resumed from the handle before the update: applied once more.
    log.add(ev.Disconnected(1, "go_away"), ev.Connected(2, "h-old"))
    assert effects(log) == [ApplyContext(changed)]
    # Resumed from the one after it (or fresh): holds it.
    log.add(ev.Disconnected(2, "error"), ev.Connected(3, "h-new"))
    assert effects(log) == []
    log.add(ev.Disconnected(3, "error"), ev.Connected(4))
    assert effects(log) == []


def test_a_prompt_change_without_context_update_starts_a_fresh_session():
    for model in (G25, G31):
        log = live(model)
        log.add(ev.HandleIssued(1, "h1"))
        out = observe(log, SettingsUpdate(("system_instruction",),
                                          {"system_instruction": "New."}))
        assert out[-1] == ev.ReconnectRequested("settings", ["system_instruction"])
        # No source shows a resumed session adopting a new prompt from its setup.
        assert choose_resumption(log.state(), ALL, log.now_us) is None, model
        # Another setting does not need that: the handle stays usable.
        log2 = live(model)
        log2.add(ev.HandleIssued(1, "h1"))
        observe(log2, SettingsUpdate(("voice",), {"voice": "Puck"}))
        assert choose_resumption(log2.state(), ALL, log2.now_us) == "h1", model


def test_a_setting_other_than_prompt_or_tools_reconnects_on_3_8_and_keeps_the_context():
    log = live(G38)
    observe(log, SettingsUpdate(("system_instruction", "voice"),
                                {"system_instruction": "New.", "voice": "Puck"}))
    assert log.state().reconnect_pending == "settings"
    assert effects(log) == [ApplyContext(log.version - 1), Reconnect("settings")]


# --------------------------------------------------------------------------- what a resumed session lacks

def talked(model: str) -> Log:
    """A call whose first session heard a turn, issued a handle, then heard another turn."""
    log = live(model)
    log.add(ev.ConversationMessage("user", "Where is order 42?", 1),
            ev.ConversationMessage("assistant", "Let me look.", 1),
            ev.HandleIssued(1, "h1"),
            ev.ConversationMessage("user", "And order 43?", 1),
            ev.Disconnected(1, "error"))
    return log


def test_on_2_5_a_resumed_session_is_told_the_turns_after_its_handle_once():
    log = talked(G25)
    assert choose_resumption(log.state(), ALL, log.now_us) == "h1"
    log.add(ev.Connected(2, "h1"))
    state = log.state()
    late = state.message_marks[-1][0]
    assert effects(log) == [SendConversation(late)]
    assert catch_up_turns(state, late) == [("user", "And order 43?")]
    log.add(ev.ConversationSending(2, late, "content"))
    assert effects(log) == []
    log.add(ev.ConversationSent(2, late, "content"), ev.HandleIssued(2, "h2"))
    assert effects(log) == [] and not unheld_messages(log.state())
    # A later session resumed from h2 lacks nothing; one from h1 lacks the turn again.
    assert unheld_messages(log.state(), log.state().handles["h2"]) == []
    assert unheld_messages(log.state(), log.state().handles["h1"]) == [late]


def test_where_content_cannot_go_mid_session_a_handle_that_lacks_turns_is_not_resumed():
    for model in (G31, G38, G38T):
        log = talked(model)
        assert choose_resumption(log.state(), ALL, log.now_us) is None, model


def test_a_seed_covers_the_turns_so_far_and_later_turns_are_heard():
    log = talked(G31)
    log.add(ev.Connected(2))
    through = log.state().message_marks[-1][0]
    log.add(ev.ConversationSending(2, through, "seed"), ev.ConversationSent(2, through, "seed"),
            ev.ConversationMessage("user", "Thanks", 2), ev.HandleIssued(2, "h2"))
    state = log.state()
    assert unheld_messages(state, state.handles["h2"]) == []
    assert choose_resumption(state, ALL, log.now_us) == "h2"


def test_an_unconfirmed_seed_keeps_the_handles_after_it_out():
    log = live(G25)
    log.add(ev.ConversationMessage("user", "Hello", 0), ev.ConversationSending(1, 3, "seed"),
            ev.HandleIssued(1, "h1"), ev.Disconnected(1, "error"))
    assert choose_resumption(log.state(), ALL, log.now_us) is None


# --------------------------------------------------------------------------- the policy

def test_resumption_policy():
    long_prompt = "x" * 4 * 201  # over 200 tokens
    log = live(G31)
    log.add(ev.SettingsChanged(["voice"], {"system_instruction": long_prompt}, True),
            ev.HandleIssued(1, "h1"), ev.Disconnected(1, "error"))
    state = log.state()
    assert choose_resumption(state, ALL, log.now_us) is None  # 3.1 loses such context
    assert choose_resumption(state, Policy(resumption="prefer"), log.now_us) == "h1"
    short = live(G31)
    short.add(ev.HandleIssued(1, "h1"), ev.Disconnected(1, "error"))
    assert choose_resumption(short.state(), ALL, short.now_us) == "h1"
    assert choose_resumption(short.state(), Policy(resumption="avoid"), short.now_us) is None
    with pytest.raises(ValueError, match="resumption"):
        Policy(resumption="sometimes")


# --------------------------------------------------------------------------- snapshots, replay

def test_decisions_on_a_compacted_state_equal_the_full_fold():
    log = talked(G25)
    log.add(ev.Connected(2, "h1"))
    full = log.state()
    small = compact(full)
    assert unheld_messages(small) == unheld_messages(full)
    assert due(small, ALL, log.now_us) == due(full, ALL, log.now_us)


def test_a_3_x_call_replays_clean_and_a_client_content_result_on_3_1_diverges():
    log = non_blocking_running(G38)
    changed = log.add(ev.SettingsChanged(["system_instruction"], {"system_instruction": "N"},
                                         False, True))
    log.add(ev.ContextSending(1, changed), ev.ContextSent(1, changed),
            ev.ToolCallProgress("c1", 1, {"step": 1}, "SILENT"),
            ev.ToolResultSending("c1", 1, "tool_response", 1),
            ev.ToolResultSent("c1", 1, "tool_response", 1),
            ev.ToolCallCompleted("c1", {"ok": 1}, scheduling="WHEN_IDLE"),
            ev.ToolResultSending("c1", 1, "tool_response"),
            ev.ToolResultSent("c1", 1, "tool_response"))
    report = replay(log.records())
    assert report.ok, report.to_json()
    bad = live(G31)
    arrive(bad, "c1")
    bad.add(ev.ToolCallStarted("c1", 1, "call-1:c1", 1), ev.ToolCallCompleted("c1", {"ok": 1}),
            ev.Disconnected(1, "error"), ev.Connected(2),
            ev.ToolResultSending("c1", 2, "content"), ev.ToolResultSent("c1", 2, "content"))
    [d] = replay(bad.records()).divergences
    assert "via content" in d.message and "via text" in d.message
