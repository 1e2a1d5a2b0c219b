"""The comparison of a re-run's log with the original (pure): what a decision is, what is
left out, and which decision a difference is reported at."""

from __future__ import annotations

from session_store.audit.reproduce import build, decisions, first_divergence


def line(v: int, at: int, type_: str, **data) -> dict:
    return {"call": "c", "version": v, "recorded_at_us": at, "type": type_, "data": data}


LOG = [line(1, 10, "session.opened", model="m", tools=["t"], worker="w1", settings={}),
       line(2, 20, "connection.connected", generation=1, handle=None),
       line(3, 30, "speech.bot_started", generation=1, source="model"),
       line(4, 30, "tool.call_requested", call_id="a", name="t", args={}, generation=1),
       line(5, 30, "tool.call_deferred", call_id="a"),
       line(6, 40, "connection.handle_issued", generation=1, handle="h-1")]


def test_a_decision_is_one_commits_run_of_versions():
    assert [(d.first, d.last) for d in decisions(LOG)] == [(1, 1), (2, 2), (3, 5), (6, 6)]


def test_workers_and_handle_strings_do_not_count_and_a_regrouped_commit_agrees():
    rerun = [dict(x) for x in LOG]
    rerun[0] = line(1, 11, "session.opened", model="m", tools=["t"], worker="w2", settings={})
    rerun[4] = line(5, 35, "tool.call_deferred", call_id="a")  # committed on its own
    rerun[5] = line(6, 45, "connection.handle_issued", generation=1, handle="other")
    assert first_divergence(LOG, rerun) is None


def test_the_first_differing_event_is_reported_at_its_logged_decision():
    rerun = LOG[:4] + [line(5, 30, "tool.call_started", call_id="a", attempt=1,
                            idempotency_key="c:a", epoch=1)] + LOG[5:]
    d = first_divergence(LOG, rerun)
    assert (d.decision.first, d.decision.last, d.version) == (3, 5, 5)
    assert "at v5 the log has tool.call_deferred, today's service tool.call_started" \
        in d.message()
    assert first_divergence(LOG, LOG[:5]).version == 6  # a decision never taken
    assert first_divergence(LOG[:5], LOG).version == 6  # one the log does not have


def test_each_stimulus_waits_for_the_commit_before_its_effect():
    spec = build(LOG)
    steps = [(s["step"], s["at"]) for s in spec["connections"][0]["steps"]]
    assert steps == [("Audio", 2), ("ToolCall", 2), ("ResumptionUpdate", 5)]


def test_an_observation_is_compared_without_the_time_it_was_read():
    def go_away(at_us: int, left: float) -> list[dict]:
        return LOG[:2] + [line(3, 50, "decision.observed", kind="GoAway", refs={},
                               withheld="", data={"generation": 1, "time_left_s": left,
                                                  "read_at_us": at_us})]
    assert first_divergence(go_away(1, 8.0), go_away(999, 7.99997)) is None
    assert first_divergence(go_away(1, 8.0), go_away(1, 5.0)).version == 3


def test_a_commit_is_split_at_its_logged_observations():
    def observed(v: int, kind: str, events: int, **data) -> dict:
        return line(v, 30, "decision.observed", kind=kind, events=events, refs={},
                    withheld="", data=data)
    log = LOG[:2] + [observed(3, "SpeechStarted", 1, generation=1),
                     line(4, 30, "speech.bot_started", generation=1, source="model"),
                     line(5, 30, "conversation.message", generation=1, role="assistant",
                          text="hi", late=False),
                     observed(6, "ToolCallsArrived", 2, generation=1,
                              calls=[{"call_id": "a", "name": "t"}]),
                     line(7, 30, "tool.call_requested", call_id="a", name="t", args={},
                          generation=1),
                     line(8, 30, "tool.call_deferred", call_id="a")]
    assert [(d.first, d.last) for d in decisions(log)] == [(1, 1), (2, 2), (3, 4), (5, 5),
                                                           (6, 8)]
    rerun = log[:7] + [line(8, 30, "tool.call_started", call_id="a", attempt=1,
                            idempotency_key="c:a", epoch=1)]
    d = first_divergence(log, rerun)
    assert (d.decision.first, d.decision.last, d.version) == (6, 8, 8)
    assert d.message().startswith("first divergence at decision v6–8 (ToolCallsArrived a "
                                  "(generation 1)): at v8 the log has tool.call_deferred")
    # the stimuli are still gated on commits: the toolCall goes out after v2
    steps = build(log)["connections"][0]["steps"]
    assert ("ToolCall", 2) in [(s["step"], s["at"]) for s in steps]


def test_a_tool_call_is_sent_where_the_commit_has_it():
    """A handle logged after a toolCall in one commit came in after it (seen: the re-run's
    server sent the handle first, and the service logged it before the toolCall)."""
    log = LOG[:3] + [line(4, 30, "tool.call_requested", call_id="a", name="t", args={},
                          generation=1),
                     line(5, 30, "connection.handle_issued", generation=1, handle="h-1"),
                     line(6, 30, "tool.call_requested", call_id="b", name="t", args={},
                          generation=1)]
    steps = [(s["step"], s["at"]) for s in build(log)["connections"][0]["steps"]]
    assert steps == [("Audio", 2), ("ToolCall", 2), ("ResumptionUpdate", 2)]
    call = build(log)["connections"][0]["steps"][1]
    assert [c["id"] for c in call["args"]["calls"]] == ["a", "b"]  # one toolCall, both calls


def test_a_tool_call_noted_during_the_commit_before_goes_out_during_it():
    """The receive loop commits a toolCall on arrival unless a commit holds the log: one
    whose commit logs an observation after it (the handle behind it) waited, so it came in
    while the commit before was under way, with what its commit logged from the model."""
    def observed(v: int, at: int, kind: str, **data) -> dict:
        return line(v, at, "decision.observed", kind=kind, events=1, refs={}, withheld="",
                    data={"generation": 1, **data})

    def steps(handle_at: int) -> list[tuple]:
        log = LOG[:2] + [
            observed(3, 30, "SpeechStarted"),
            line(4, 30, "speech.bot_started", generation=1, source="model"),
            line(5, 40, "conversation.message", generation=1, role="assistant", text="hi",
                 late=False),
            observed(6, 40, "ToolCallsArrived", calls=[{"call_id": "a", "name": "t"}]),
            line(7, 40, "tool.call_requested", call_id="a", name="t", args={}, generation=1),
            observed(8, handle_at, "HandleArrived"),
            line(9, handle_at, "connection.handle_issued", generation=1, handle="h-1")]
        return [(s["step"], s["at"], s.get("during_commit", False))
                for s in build(log)["connections"][0]["steps"]]

    # the speech's commit (v3-4) runs from v2: the rest goes out while it is under way
    assert steps(handle_at=40) == [("Audio", 2, False), ("OutputTranscript", 2, True),
                                   ("TurnComplete", 2, True), ("ToolCall", 2, True),
                                   ("ResumptionUpdate", 2, True)]
    # committed on arrival (the handle in a commit of its own): after the commit before
    assert steps(handle_at=50) == [("Audio", 2, False), ("OutputTranscript", 4, False),
                                   ("TurnComplete", 4, False), ("ToolCall", 4, False),
                                   ("ResumptionUpdate", 7, False)]


def test_a_log_from_before_the_handles_gate_compares_without_its_events():
    """A re-run logs the gate's facts and each handle's observation (HandleArrived); a log
    written before them has neither: they are left out of the comparison, the handle itself
    is compared. A log that has them compares them all."""
    observed = line(7, 40, "decision.observed", kind="HandleArrived", events=1,
                    refs={"handle": [0, "handle"]}, withheld="", data={"generation": 1})
    rerun = LOG[:5] + [line(6, 40, "connection.model_reacted", generation=1), observed,
                       line(8, 40, "connection.handle_issued", generation=1, handle="h")]
    assert first_divergence(LOG, rerun) is None
    withheld = rerun[:7] + [line(8, 40, "connection.handle_withheld", generation=1,
                                 handle="h")]
    assert first_divergence(LOG, withheld).version == 6  # the handle, as the log numbers it
    # Written by today's code (it has a gate event): a gate event it lacks is a divergence.
    today = LOG[:5] + [line(6, 35, "connection.send_unread", generation=1,
                            turn_under_way=False)] + [dict(x, version=7) for x in LOG[5:]]
    again = today[:6] + [line(7, 40, "connection.model_reacted", generation=1),
                         dict(observed, version=8),
                         line(9, 40, "connection.handle_issued", generation=1, handle="h")]
    assert first_divergence(today, again).version == 7


def observed(v: int, at: int, kind: str, events: int, **data) -> dict:
    return line(v, at, "decision.observed", kind=kind, data=data, events=events, refs={},
                withheld="")


TURN = [line(1, 10, "session.opened", model="m", tools=["t"], worker="w1", settings={}),
        line(2, 20, "connection.connected", generation=1, handle=None)]


def test_the_callers_words_compare_by_whether_they_are_late_and_audio_by_nothing():
    def flush(since, audio_from):
        return TURN + [
            observed(3, 30, "TranscriptFlushed", 2, generation=1, words=[["Refund it", since]],
                     said_audio_s=0.8, said_audio_from_us=audio_from),
            line(4, 30, "conversation.message", role="user", text="Refund it", generation=1),
            line(5, 30, "conversation.message", role="assistant", text="Done.", generation=1,
                 audio_s=0.8, audio_from_us=audio_from)]
    assert first_divergence(flush(0.99, 25), flush(0.01, 27)) is None
    assert first_divergence(flush(None, 25), flush(None, 27)) is None
    assert first_divergence(flush(0.99, 25), flush(None, 25)).version == 3
    assert first_divergence(flush(0.99, 25), flush(3.5, 25)).version == 3  # not late now


def test_a_takeovers_cut_compares_whether_it_cut_not_where():
    def taken_over(cut: str | None) -> list[dict]:
        log = TURN + [line(3, 30, "conversation.message", role="assistant", generation=1,
                           text="one two three four", audio_s=2.0, audio_from_us=29),
                      line(4, 40, "session.worker_attached", epoch=2, reason="takeover",
                           worker="w2")]
        if cut is not None:
            log += [observed(5, 41, "TakenOver", 1, playback_lead_s=0.24),
                    line(6, 41, "conversation.message_cut", generation=1, text=cut)]
        return log
    assert first_divergence(taken_over("one —"), taken_over("one two —")) is None
    assert first_divergence(taken_over("one —"), taken_over(None)).version == 5
    # The re-run takes over as long after the message's first audio as the log did, with
    # the logged lead; a takeover that cut nothing gets a lead under which it cuts nothing.
    assert build(taken_over("one —"))["workers"][1]["after_audio_us"] == 11
    assert build(taken_over("one —"))["workers"][1]["playback_lead_s"] == 0.24
    assert build(taken_over(None))["workers"][1]["playback_lead_s"] >= 3600


def test_what_the_model_sent_behind_a_playbacks_stop_waits_for_the_re_runs_stop():
    # One commit: the greeting's playback stopped (noted first), then the next turn began
    # and its words came: on the wire they came after the stop.
    log = TURN + [line(3, 30, "speech.bot_started", generation=1, source="model"),
                  line(4, 30, "conversation.message", role="assistant", text="Hi.",
                       generation=1),
                  line(5, 40, "speech.bot_stopped", generation=1, source="transport"),
                  line(6, 40, "speech.bot_started", generation=1, source="model"),
                  line(7, 40, "conversation.message", role="assistant", text="Refund?",
                       generation=1)]
    spec = build(log)
    assert spec["playback"] == [{"from": 4, "until": 5, "steps_after": True}]
    steps = [(s["step"], s["at"], s.get("after_played")) for s in spec["connections"][0]["steps"]]
    assert steps == [("Audio", 2, None), ("OutputTranscript", 2, None), ("TurnComplete", 2, None),
                     ("Audio", 4, 4), ("OutputTranscript", 4, 4), ("TurnComplete", 4, 4)]
    # A stop alone in its commit holds nothing back.
    assert "steps_after" not in build(log[:5])["playback"][0]
