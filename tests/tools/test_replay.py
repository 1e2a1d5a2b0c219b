"""Replay (pure): today's decide/due against logged decisions; every divergence is found."""

from __future__ import annotations

from dataclasses import replace

from session_store import events as ev
from session_store.audit import parse_policy, replay
from session_store.decide import NO_NAME_ERROR
from session_store.policy import Policy
from session_store.projection import fold
from session_store.state import Withholding

from .helpers import chain, reissued_call, support_call

OPEN = [(0, ev.SessionOpened("gemini-live", ["lookup_order", "book"], "w1", 1)),
        (0, ev.Connected(1))]


def run(timed, policy: Policy | None = None, call_id: str = "r"):
    return replay(chain(call_id, timed), policy, call_id=call_id)


def test_a_correct_call_replays_without_divergence():
    report = replay(chain("support-1", support_call()))
    assert report.ok, report.to_json()
    assert (report.events, report.decisions_checked, report.effects_checked) == (25, 6, 7)


def test_a_call_not_deferred_while_the_bot_spoke_is_reported():
    timed = OPEN + [
        (100, ev.BotStartedSpeaking(1)),
        (200, ev.ToolCallRequested("c1", "lookup_order", {"id": 1}, 1)),  # old code: no defer
        (210, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
        (400, ev.ToolCallCompleted("c1", {"ok": True})),
        (900, ev.BotStoppedSpeaking(1)),
    ]
    report = run(timed)
    assert not report.ok
    d, start = report.divergences
    assert (d.version, d.to_version, d.kind) == (4, 4, "decide")
    assert d.logged == [{"type": "tool.call_requested", "data": {
        "call_id": "c1", "name": "lookup_order", "args": {"id": 1}, "generation": 1,
        "mode": "blocking", "declared": None}}]
    assert d.decided == d.logged + [{"type": "tool.call_deferred", "data": {"call_id": "c1"}}]
    assert "tool.call_deferred for c1 (the bot was speaking)" in d.message
    assert d.observation["observation"] == "ToolCallsArrived"
    # and it was started while the bot still spoke (I4)
    assert (start.version, start.kind) == (5, "due")
    assert "the bot is speaking and the tool is deferrable" in start.message


def test_another_policy_shows_where_decisions_would_change():
    recs = chain("support-1", support_call())
    report = replay(recs, parse_policy(defer="none"))
    [d] = report.divergences
    assert (d.version, d.to_version, d.kind) == (6, 7, "decide")
    assert "the log has tool.call_deferred for c1, today's code does not" in d.message
    # deferring only another tool is the same as "none" for lookup_order
    assert len(replay(recs, parse_policy(defer="book")).divergences) == 1
    assert replay(recs, parse_policy(defer="lookup_order,book")).ok
    assert parse_policy(end_call_on_give_up="gemini_unreachable").end_call_on_give_up == \
        "gemini_unreachable" and parse_policy().end_call_on_give_up is None


def test_a_settings_change_without_its_reconnect_is_reported():
    timed = OPEN + [(100, ev.SettingsChanged(["system_instruction"], {}, True))]
    [d] = run(timed).divergences
    assert d.kind == "decide" and d.version == 3
    assert d.decided[1] == {"type": "connection.reconnect_requested",
                            "data": {"reason": "settings", "keys": ["system_instruction"]}}


def test_a_reconnect_mid_turn_is_reported():
    timed = OPEN + [
        (100, ev.BotStartedSpeaking(1)),
        (200, ev.SettingsChanged(["voice"], {"voice": "Kore"}, True)),
        (200, ev.ReconnectRequested("settings", ["voice"])),
        (300, ev.Disconnected(1, "settings")),  # still speaking: cuts the audio (I5)
        (400, ev.Connected(2)),
    ]
    [d] = run(timed).divergences
    assert (d.version, d.kind) == (6, "due")
    assert "today's code would wait: the bot is still speaking" in d.message


def test_a_reconnect_before_deferred_calls_started_is_reported():
    timed = OPEN + [
        (100, ev.BotStartedSpeaking(1)),
        (150, ev.ToolCallRequested("c1", "book", {}, 1)), (150, ev.ToolCallDeferred("c1")),
        (200, ev.SettingsChanged(["voice"], {}, True)),
        (200, ev.ReconnectRequested("settings", ["voice"])),
        (300, ev.BotStoppedSpeaking(1)),
        (310, ev.Disconnected(1, "settings")),
    ]
    [d] = run(timed).divergences
    assert d.version == 9 and "tool calls are still waiting to start" in d.message


def test_a_duplicate_send_is_reported():
    timed = OPEN + [
        (100, ev.ToolCallRequested("c1", "book", {}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
        (200, ev.ToolCallCompleted("c1", "done")),
        (210, ev.ToolResultSending("c1", 1, "tool_response")),
        (220, ev.ToolResultSent("c1", 1, "tool_response")),
        (300, ev.ToolResultSending("c1", 1, "tool_response")),  # again: I2 broken
        (310, ev.ToolResultSent("c1", 1, "tool_response")),
    ]
    [d] = run(timed).divergences
    assert (d.version, d.kind) == (8, "due")
    assert "already in the model's state: this is a duplicate" in d.message


def test_the_wrong_delivery_channel_is_reported():
    timed = OPEN + [
        (100, ev.ToolCallRequested("c1", "book", {}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
        (150, ev.Disconnected(1, "error", "socket closed")),
        (160, ev.Connected(2)),
        (200, ev.ToolCallCompleted("c1", "done")),
        # generation 2 never issued c1: a toolResponse would leave the model stuck
        (210, ev.ToolResultSending("c1", 2, "tool_response")),
    ]
    [d] = run(timed).divergences
    assert d.version == 8 and "today's code: via content on generation 2" in d.message


def test_in_doubt_resolution_depends_on_the_idempotent_policy():
    timed = OPEN + [
        (100, ev.ToolCallRequested("c1", "book", {"room": 1}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
        (500, ev.WorkerAttached("w2", 2)),
        (510, ev.ToolCallFailed("c1", "outcome unknown", outcome_unknown=True)),
    ]
    assert run(timed).ok
    [d] = run(timed, parse_policy(idempotent="book")).divergences
    assert d.version == 6 and "today's code would re-run it (idempotent tool)" in d.message
    assert {"effect": "StartCall", "call_id": "c1", "attempt": 2,
            "idempotency_key": "r:c1"} in d.decided


def test_calls_must_start_in_request_order():
    timed = OPEN + [
        (100, ev.BotStartedSpeaking(1)),
        (150, ev.ToolCallRequested("c1", "book", {}, 1)), (150, ev.ToolCallDeferred("c1")),
        (160, ev.ToolCallRequested("c2", "book", {"x": 1}, 1)), (160, ev.ToolCallDeferred("c2")),
        (300, ev.BotStoppedSpeaking(1)),
        (310, ev.ToolCallStarted("c2", 1, "r:c2", 1)),
        (311, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
    ]
    [d] = run(timed).divergences
    assert d.version == 9 and "c2 started before c1" in d.message


def test_starting_a_deferred_call_while_the_bot_speaks_is_reported():
    timed = OPEN + [
        (100, ev.BotStartedSpeaking(1)),
        (150, ev.ToolCallRequested("c1", "book", {}, 1)), (150, ev.ToolCallDeferred("c1")),
        (200, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
    ]
    [d] = run(timed).divergences
    assert "deferred and the bot is still speaking" in d.message


def test_resumption_choice_is_compared():
    timed = OPEN + [
        (100, ev.HandleIssued(1, "h-1")),
        (200, ev.Disconnected(1, "error", "reset")),
        (300, ev.Connected(2)),  # fresh, though h-1 was usable
    ]
    [d] = run(timed).divergences
    assert d.kind == "resumption" and "today's code would resume from handle 'h-1'" in d.message
    # after a refused resumption the shell may fall back to a fresh session
    refused = timed[:-1] + [(250, ev.Disconnected(1, "handshake_failed")), (300, ev.Connected(2))]
    assert run(refused).ok


def test_resumption_choice_leaves_out_the_handles_the_worker_passed_over():
    """The service logs a failed handshake as a `handshake_failed` anomaly: a handle it passed
    over (refused) is not today's choice either; one it retries (a transient failure) is."""
    def failed(handle, passed_over):
        return ev.AnomalyRecorded("handshake_failed", {
            "handle": handle, "error": "x", "handle_refused": passed_over, "failures": 1,
            "passed_over": passed_over}, 1)

    timed = OPEN + [(100, ev.HandleIssued(1, "h-1")), (150, ev.HandleIssued(1, "h-2")),
                    (200, ev.Disconnected(1, "error", "reset"))]
    assert run(timed + [(250, failed("h-2", True)), (300, ev.Connected(2, "h-1"))]).ok
    assert run(timed + [(250, failed("h-2", False)), (300, ev.Connected(2, "h-2"))]).ok
    [d] = run(timed + [(250, failed("h-2", False)), (300, ev.Connected(2, "h-1"))]).divergences
    assert "today's code would resume from handle 'h-2'" in d.message
    # A takeover forgets what the dead worker passed over.
    taken_over = timed + [(250, failed("h-2", True)), (260, ev.WorkerAttached("w2", 2)),
                          (300, ev.Connected(2, "h-1"))]
    [d] = run(taken_over).divergences
    assert "today's code would resume from handle 'h-2'" in d.message


def test_reuse_of_a_recorded_result_and_the_reuse_policy():
    timed = OPEN + [
        (50, ev.HandleIssued(1, "h-1")),
        (100, ev.ToolCallRequested("c1", "book", {"room": 1}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
        (200, ev.ToolCallCompleted("c1", "booked")),
        (210, ev.ToolResultSending("c1", 1, "tool_response")),
        (220, ev.ToolResultSent("c1", 1, "tool_response")),
        (300, ev.Disconnected(1, "error")),
        (310, ev.Connected(2, "h-1")),  # state before c1: Gemini asks again
        (400, ev.ToolCallRequested("c9", "book", {"room": 1}, 2)),
        (400, ev.ToolCallCompleted("c9", "booked", reused_from="c1")),
    ]
    report = run(timed)
    assert report.ok, report.to_json()
    [d] = run(timed, parse_policy(reuse="none")).divergences
    assert (d.version, d.to_version) == (11, 12)
    assert d.decided == [d.logged[0]]


def test_cancellations_and_grouped_tool_calls():
    timed = OPEN + [
        (100, ev.ToolCallRequested("c1", "book", {}, 1)),
        (100, ev.ToolCallRequested("c2", "book", {"b": 1}, 1)),
        # a call without name is recorded and failed at once, so the model gets an answer
        (100, ev.ToolCallRequested("c3", "", {}, 1)),
        (100, ev.AnomalyRecorded("tool_call_without_name", {"call_id": "c3"}, 1)),
        (100, ev.ToolCallFailed("c3", NO_NAME_ERROR)),
        (200, ev.ToolCallCancelled("c1", "server")),
        (200, ev.AnomalyRecorded("cancellation_for_unknown_call", {"call_id": "zz"}, 1)),
    ]
    report = run(timed)
    assert report.ok and report.decisions_checked == 2
    # a cancellation of a call whose result the model already has: today's code ignores it
    late = OPEN + [
        (100, ev.ToolCallRequested("c1", "book", {}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
        (200, ev.ToolCallCompleted("c1", "ok")),
        (210, ev.ToolResultSending("c1", 1, "tool_response")),
        (220, ev.ToolResultSent("c1", 1, "tool_response")),
        (300, ev.ToolCallCancelled("c1", "server")),
    ]
    [d] = run(late).divergences
    assert d.version == 8 and d.decided == []


def test_a_log_that_cannot_be_read_is_an_error_not_a_pass():
    recs = chain("r", OPEN)
    broken = recs + [replace(recs[1], version=3, type="from.the.future")]
    report = replay(broken)
    assert not report.ok and "cannot replay past version 3" in report.error


def test_a_reissued_call_replays_and_its_link_is_a_decision():
    recs = chain("reissue-1", reissued_call())
    report = replay(recs)
    assert report.ok, report.to_json()
    assert report.decisions_checked == 2  # c1 arrived; c2 arrived and was linked to c1
    [d] = replay(recs, parse_policy(reuse="none")).divergences
    assert (d.version, d.to_version) == (7, 8)
    assert d.logged[1] == {"type": "tool.call_reissued", "data": {"call_id": "c2",
                                                                   "original": "c1"}}


def test_seeded_results_are_checked_against_what_seeding_means():
    timed = OPEN + [
        (100, ev.ToolCallRequested("c1", "book", {}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
        (200, ev.ToolCallCompleted("c1", "ok")),
        (300, ev.WorkerAttached("w2", 2)),
        (400, ev.Connected(2)),  # fresh: the history is seeded, c1's result with it
        (410, ev.ToolResultSending("c1", 2, "seed")),
        (420, ev.ToolResultSent("c1", 2, "seed")),
    ]
    report = run(timed)
    assert report.ok, report.to_json()
    early = OPEN + [(100, ev.ToolCallRequested("c1", "book", {}, 1)),
                    (300, ev.WorkerAttached("w2", 2)), (400, ev.Connected(2)),
                    (410, ev.ToolResultSending("c1", 2, "seed"))]
    [d] = run(early).divergences
    assert d.version == 6 and "it has no outcome yet" in d.message


def test_a_cancelled_reissue_with_its_deferred_original_replays():
    """Gemini re-asks (c2) for a deferred call its resumed state lost (c1), then cancels c2:
    the original is cancelled with it, in the same decision (`reissue_cancelled`)."""
    timed = OPEN + [
        (50, ev.HandleIssued(1, "h0")),
        (60, ev.BotStartedSpeaking(1)),
        (100, ev.ToolCallRequested("c1", "book", {"room": 1}, 1)),
        (100, ev.ToolCallDeferred("c1")),
        (150, ev.GoAwayReceived(1, 0.0)),  # the deadline cuts the turn
        (200, ev.Disconnected(1, "go_away")),
        (200, ev.BotStartedSpeaking(1, "transport")),
        (210, ev.Connected(2, "h0")),
        (300, ev.ToolCallRequested("c2", "book", {"room": 1}, 2)),
        (300, ev.ToolCallReissued("c2", "c1")),
        (400, ev.ToolCallCancelled("c2", "server")),
        (400, ev.ToolCallCancelled("c1", "reissue_cancelled")),
    ]
    report = run(timed)
    assert report.ok, report.to_json()
    # The same log without the original's cancellation is what the code before decided.
    [d] = run(timed[:-1]).divergences
    assert d.decided[-1] == {"type": "tool.call_cancelled",
                             "data": {"call_id": "c1", "reason": "reissue_cancelled"}}


def test_a_go_away_reconnect_mid_turn_is_reported():
    """A goAway with 30 s left does not cut the bot's turn: reconnecting at once is a
    divergence, as it is for a settings change."""
    timed = OPEN + [(100, ev.BotStartedSpeaking(1)), (200, ev.GoAwayReceived(1, 30.0)),
                    (300, ev.Disconnected(1, "go_away")), (400, ev.Connected(2))]
    report = run(timed)
    [d] = report.divergences
    assert (d.version, d.kind) == (5, "due")
    assert "the log reconnects (go_away) on generation 1; today's code would wait: the bot " \
           "is still speaking" == d.message


def test_a_seed_into_a_resumed_session_is_reported():
    """Only a fresh session's history is seeded: a resumed one already holds its history."""
    timed = OPEN + [(100, ev.HandleIssued(1, "h-1")), (200, ev.Disconnected(1, "error")),
                    (300, ev.Connected(2, "h-1")),
                    (310, ev.ToolCallRequested("c1", "book", {}, 2)),
                    (320, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
                    (330, ev.ToolCallCompleted("c1", "ok")),
                    (400, ev.ToolResultSending("c1", 2, "seed"))]
    [d] = run(timed).divergences
    assert (d.version, d.kind) == (9, "due")
    assert d.message.endswith("only a fresh session is seeded")


def test_a_send_on_a_generation_that_is_gone_is_reported():
    timed = OPEN + [(100, ev.ToolCallRequested("c1", "book", {}, 1)),
                    (110, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
                    (150, ev.Disconnected(1, "error")), (160, ev.Connected(2)),
                    (200, ev.ToolCallCompleted("c1", "ok")),
                    (210, ev.ToolResultSending("c1", 1, "content"))]
    [d] = run(timed).divergences
    assert d.version == 8 and d.message == ("the log sends c1 via content on generation 1; "
                                            "today's code: via content on generation 2")


def test_an_error_says_how_far_the_replay_got():
    recs = chain("r", OPEN)
    broken = recs + [replace(recs[1], version=3, type="from.the.future")]
    report = replay(broken)
    assert report.events == 2 and report.error.startswith("cannot replay past version 3")
    assert report.to_json()["ok"] is False


def test_arguments_the_log_did_not_keep_replay_without_divergence():
    """Arguments over max_args_bytes are logged as a preview; replay stands in arguments of
    the same size (same refusal) and compares them as absent: no divergence."""
    from .test_redaction_and_errors import _decided_preview_call

    report = run(_decided_preview_call(), Policy(max_args_bytes=80), call_id="preview-1")
    assert report.ok and report.decisions_checked == 2, report.to_json()


# --------------------------------------------------------------------------- logged observations

def logged_call(steps, policy: Policy | None = None, call_id: str = "obs"):
    """A log as the driver writes it: each observation decided on the state then, logged with
    `decision.observed` before its events; "due" logs the calls due to start (their intents)."""
    from session_store.decide import decide
    from session_store.delivery import StartCall, due
    from session_store.intents import intents
    from session_store.observed import observation_record
    from session_store.projection import fold

    policy = policy or Policy()
    timed: list = [(0, ev.SessionOpened("gemini-live", ["lookup_order", "book"], "w1", 1))]
    for offset, step in steps:
        state = fold(chain(call_id, timed))
        if step == "due":
            found = intents(state, due(state, policy, state.last_event_at_us),
                            frozenset({StartCall}), 1)
        elif isinstance(step, ev.Event):
            found = [step]
        else:
            decided = decide(state, step, policy)
            found = [observation_record(step, decided, state), *decided] if decided else []
        timed += [(offset, e) for e in found]
    return chain(call_id, timed)


def every_kind_call():
    from session_store.decide import (CancellationArrived, FunctionCall, GoAway,
                                      InterruptionObserved, ResultReturned, SessionLeft,
                                      SessionReady, SettingsUpdate, SpeechStarted,
                                      SpeechStopped, ToolCallsArrived, ToolStopped)
    return [
        (10, SessionReady(1, None, "ab" * 32)),
        # Two decisions in one clock tick stay two decisions.
        (10, ToolCallsArrived((FunctionCall("c1", "lookup_order", {"id": 1}),), 1)),
        (20, "due"),
        (30, SpeechStarted(1)),
        (40, ToolCallsArrived((FunctionCall("c2", "book", {"day": "mon"}),), 1)),
        (50, ResultReturned("c1", (ev.ToolCallCompleted("c1", {"ok": True}),))),
        (60, SpeechStopped(1)),
        (70, "due"),
        (80, ToolStopped("c2", frozenset())),
        (90, InterruptionObserved(1)),
        (100, CancellationArrived(("c7",), 1)),
        (110, SettingsUpdate(("voice",), {"voice": "Puck"})),
        (120, GoAway(1, 20.0)),
        (130, SessionLeft(1, "settings")),
    ]


def test_a_logged_call_replays_every_decision_whatever_its_kind():
    recs = logged_call(every_kind_call())
    report = replay(recs)
    assert report.ok, report.to_json()
    assert (report.decisions_logged, report.decisions_checked, report.reconstructed) == \
        (12, 12, 0)
    assert report.coverage == "12 of 12 decisions replayed"
    same_tick = [r for r in recs if r.recorded_at_us == recs[1].recorded_at_us]
    assert [r.type for r in same_tick].count("decision.observed") == 2


def test_a_changed_rule_shows_at_the_decision_it_changes():
    recs = logged_call(every_kind_call())
    report = replay(recs, parse_policy(defer="none"))
    [d] = [x for x in report.divergences if x.kind == "decide"]
    at = next(r.version for r in recs if r.type == "tool.call_requested"
              and r.data["call_id"] == "c2")
    assert (d.version, d.to_version) == (at, at + 1)  # c2's request and its deferral
    assert d.observation["observation"] == "ToolCallsArrived"
    assert "the log has tool.call_deferred for c2, today's code does not" in d.message


def test_an_observation_the_log_could_not_keep_is_named_in_the_coverage():
    from session_store.decide import CancellationArrived, SessionReady
    recs = logged_call([(10, SessionReady(1, None, "ab" * 32)),
                        (20, CancellationArrived(("x\udcff",), 1))])
    report = replay(recs)
    assert report.decisions_logged == 2 and report.not_replayed == {"CancellationArrived": 1}
    assert report.coverage == "1 of 2 decisions replayed (not replayed: 1 CancellationArrived)"


def test_an_old_log_replays_by_reconstruction_and_says_so():
    report = replay(chain("support-1", support_call()))
    assert (report.decisions_logged, report.reconstructed) == (0, 6)
    assert report.coverage.startswith("6 decisions of a log that predates decision.observed")


def test_a_log_continued_by_newer_code_replays_both_parts():
    from session_store.decide import FunctionCall, ToolCallsArrived
    old = support_call()
    last = old[-1][0]
    new = logged_call([(last + 10, ToolCallsArrived(
        (FunctionCall("c9", "lookup_order", {"id": 9}),), 2))], call_id="support-1")
    recs = chain("support-1", old + [(last + 10, r.event) for r in new[1:]])
    report = replay(recs)
    assert (report.reconstructed, report.decisions_logged) == (6, 1), report.to_json()


def gate_call():
    """A session's handles, decided on the gate the log folds (withholding.py): issued while
    the session holds all it was told, withheld after a send until the model reacts."""
    from session_store.decide import HandleArrived, SessionReady
    return [
        (10, SessionReady(1, None, "ab" * 32)),
        (20, HandleArrived(1, "h-early")),  # before the seed: withheld
        (30, ev.HoldsAll(1)),
        (40, HandleArrived(1, "h-1", 2)),
        (50, ev.SendUnread(1, turn_under_way=True)),
        (60, HandleArrived(1, "h-2")),
        (70, ev.EarlierTurnEnded(1)),
        (80, HandleArrived(1, "h-3")),
        (90, ev.ModelReacted(1)),
        (100, HandleArrived(1, "h-4", 5)),
    ]


def test_handles_are_decided_again_on_the_gate_the_log_folds():
    recs = logged_call(gate_call())
    kinds = [(r.type, r.data.get("handle")) for r in recs if r.type.startswith(
        "connection.handle_")]
    assert kinds == [("connection.handle_withheld", "h-early"),
                     ("connection.handle_issued", "h-1"),
                     ("connection.handle_withheld", "h-2"),
                     ("connection.handle_withheld", "h-3"),
                     ("connection.handle_issued", "h-4")]
    report = replay(recs)
    assert report.ok, report.to_json()
    assert report.coverage == "6 of 6 decisions replayed" and report.decisions_checked == 6


def test_a_handle_the_log_issued_where_the_gate_withholds_it_is_a_divergence():
    """Code that issued a handle crossing a send (the bug withholding fixes) shows up where
    it did: today's decision on the same gate withholds it."""
    recs = logged_call(gate_call())
    events = [((r.recorded_at_us - recs[0].recorded_at_us) / 1000, r.event) for r in recs]
    at = next(i for i, (_t, e) in enumerate(events) if getattr(e, "handle", None) == "h-2")
    events[at] = (events[at][0], ev.HandleIssued(1, "h-2", None))
    report = replay(chain("r", events))
    [d] = report.divergences
    assert (d.kind, d.version) == ("decide", at + 1) and d.observation["observation"] == \
        "HandleArrived"
    assert d.decided == [{"type": "connection.handle_withheld",
                          "data": {"generation": 1, "handle": "h-2"}}]


def test_a_log_from_before_the_folded_gate_replays_as_before():
    """Logged observations, but handles logged by the worker's own gate (no HandleArrived,
    no gate events): they are not decisions, and the rest replays as it did."""
    from session_store.decide import FunctionCall, SessionReady, ToolCallsArrived
    recs = logged_call([
        (10, SessionReady(1, None, "ab" * 32)),
        (20, ev.HandleWithheld(1, "h-0")),
        (30, ev.HandleIssued(1, "h-1", 1)),
        (40, ToolCallsArrived((FunctionCall("c1", "lookup_order", {"id": 1}),), 1)),
        (50, ev.HandleIssued(1, "h-2", 2)),
    ])
    report = replay(recs)
    assert report.ok, report.to_json()
    assert report.coverage == "2 of 2 decisions replayed" and not report.reconstructed
    state = fold(recs)
    assert state.withholding == Withholding() and list(state.handles) == ["h-1", "h-2"]
