"""The timeline builder and summaries (pure): what support reads about a call."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from session_store import events as ev
from session_store.audit import build_timeline, parse_time
from session_store.audit.timeline import Takeover
from session_store.audit.summaries import CallFilter, like_pattern, status_of, summarise
from session_store.projection import fold

from .helpers import T0, at, chain, failing_call, reissued_call, support_call
from session_store.delivery import unanswered, undelivered
from session_store.lineage import in_model


def test_entries_lanes_and_summaries_of_the_support_call():
    recs = chain("support-1", support_call())
    tl = build_timeline(recs, call_id="support-1", final_state=fold(recs))
    got = [(e.version, e.lane, e.level, e.summary) for e in tl.entries]
    assert got[:4] == [
        (1, "session", "info", "session opened: model gemini-live, tools lookup_order, "
                               "send_email, worker w1, epoch 1"),
        (2, "connection", "info", "connected: generation 1, fresh (seeded history)"),
        (3, "connection", "info", "resumption handle h-1 issued on generation 1 "
                                  "(last consumed message 0)"),
        (4, "conversation", "info", "user: Where is my order 42? I am bob@example.com"),
    ]
    by_version = {v: (lane, level, s) for v, lane, level, s in got}
    assert by_version[7] == ("tools", "info", "c1: deferred until the bot stops speaking")
    assert by_version[10] == ("speech", "info", "bot stopped speaking (turn_complete) after 1.2 s")
    assert by_version[11] == ("tools", "info", "c1: lookup_order started after waiting 1120 ms")
    assert by_version[12][2].startswith("c1: completed in 300 ms")
    assert by_version[14][2] == ("c1: result sent via tool_response on generation 1, "
                                 "20 ms after the outcome")
    assert by_version[15] == ("connection", "warn", "disconnected generation 1: settings")
    assert by_version[16][2] == ("reconnected: generation 2, resumed from handle h-1 "
                                 "(reason: settings)")
    assert by_version[18][2] == "c1: result sent via content on generation 2 (sent again)"
    assert by_version[23] == ("session", "warn", "worker w2 took the call over from w1 (crash "
                                                 "after 0.80 s of silence since v22; epoch 2)")
    assert by_version[24][2] == "reconnected: generation 3, resumed from handle h-2 (reason: takeover)"
    assert [e.offset_ms for e in tl.entries][-1] == 5000.0


def test_tool_call_wait_run_and_delivery():
    recs = chain("support-1", support_call())
    c1 = build_timeline(recs, final_state=fold(recs)).tool_calls["c1"]
    assert (c1.name, c1.deferred, c1.wait_ms, c1.run_ms, c1.outcome) == (
        "lookup_order", True, 1120.0, 300.0, "completed")
    assert (c1.sent_via, c1.sent_generation, c1.send_ms) == ("tool_response", 1, 20.0)
    assert [(s.generation, s.via, s.confirmed) for s in c1.sends] == [
        (1, "tool_response", True), (2, "content", True)]
    # Held by the current session through generation 2 (resumed from h-2, issued after the
    # content send); the model spoke on generation 2 after it: the evidence.
    assert (c1.in_model, c1.in_model_evidence) == (True, {"version": 19, "kind": "spoke"})
    assert c1.requested_at_us == T0 + 400_000 and c1.sent_at_us == T0 + 1_840_000


def test_reconnects_speech_takeovers():
    recs = chain("support-1", support_call())
    tl = build_timeline(recs)
    first, second = tl.reconnects
    assert (first.reason, first.keys, first.requested_version, first.disconnected_version,
            first.connected_version, first.waited_ms, first.downtime_ms,
            first.resumed_handle, first.from_generation, first.generation) == (
        "settings", ["voice"], 9, 15, 16, 1400.0, 200.0, "h-1", 1, 2)
    assert (second.reason, second.resumed_handle, second.generation) == ("takeover", "h-2", 3)
    assert [(s.generation, s.duration_ms, s.end_source) for s in tl.speech] == [
        (1, 1200.0, "turn_complete"), (2, 700.0, "turn_complete")]
    assert tl.takeovers == [Takeover(23, T0 + 4_000_000, "w2", 2, "takeover", "crash", "w1", 22,
                                     T0 + 3_200_000, "connection.handle_issued", 800.0)]
    assert tl.problems == []


def test_problems_failures_anomalies_and_unanswered_calls():
    timed = failing_call() + [(1100, ev.ToolCallRequested("c2", "lookup_order", {"x": 1}, 1))]
    recs = chain("failing-1", timed)
    tl = build_timeline(recs, final_state=fold(recs))
    kinds = [(p["version"], p["kind"]) for p in tl.problems]
    assert kinds == [(5, "tool_failed"), (8, "anomaly:duplicate_tool_call_id"), (9, "unanswered")]
    assert tl.problems[2]["detail"]["tool_call_id"] == "c2"
    assert tl.entries[4].level == "error"


def test_a_window_clips_what_began_before_it():
    recs = chain("support-1", support_call())[9:14]  # versions 10..14
    tl = build_timeline(recs, t0_us=T0)
    c1 = tl.tool_calls["c1"]
    assert c1.clipped and c1.requested_at_us is None and c1.wait_ms is None
    assert c1.run_ms == 300.0
    assert tl.speech[0].start_us is None and tl.speech[0].end_version == 10
    assert tl.entries[0].offset_ms == 1500.0


def test_to_json_has_iso_times():
    recs = chain("support-1", support_call())
    data = build_timeline(recs, call_id="support-1").to_json()
    assert data["start"] == at(0) and data["end"] == at(5000)
    assert data["entries"][10]["at"] == at(1520)
    assert data["tool_calls"][0]["sent_at"] == at(1840)
    assert data["speech"][0] == {"generation": 1, "start": at(300), "end": at(1500),
                                 "start_version": 5, "end_version": 10,
                                 "end_source": "turn_complete", "duration_ms": 1200.0}


def test_unknown_and_unreadable_events_are_shown_as_problems():
    recs = chain("x", [(0, ev.SessionOpened("m", [], "w"))])
    from dataclasses import replace
    bad = [replace(recs[0], type="future.event"), replace(recs[0], version=2, data_json="{nope")]
    tl = build_timeline(bad)
    assert [p["kind"] for p in tl.problems] == ["unknown_event_type", "unreadable_event"]


def test_status_and_summaries():
    now = T0 + 10 * 3600 * 1_000_000
    assert status_of(True, 0, now) == "closed"
    assert status_of(False, now - 1000, now) == "open"
    assert status_of(False, T0, now) == "stale"
    s = summarise(("a", 9, 2, T0, T0 + 2_500_000),
                  {"connection.connected": 3, "tool.call_requested": 2, "session.closed": 1,
                   "session.worker_attached": 1}, now)
    assert (s.status, s.reconnects, s.tool_calls, s.takeovers, s.duration_s) == (
        "closed", 2, 2, 1, 2.5)


def test_parse_time_and_like_pattern():
    assert parse_time("2026-01-01T00:00:00Z") == T0
    assert parse_time("2026-01-01T00:00:00.000001") == T0 + 1
    now = datetime(2026, 1, 1, 2, tzinfo=timezone.utc)
    assert parse_time("2h", now) == T0
    assert parse_time(None) is None
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday'; DROP TABLE x")
    assert like_pattern("50%_off\\") == "%50\\%\\_off\\\\%"
    with pytest.raises(ValueError):
        CallFilter(status="'; DROP TABLE session_events; --")


def test_fast_delivery_view_agrees_with_the_projection():
    """state_view computes the lineage once; it must say exactly what in_model says."""
    from session_store.audit import state_view

    from .test_scale import big_call
    from session_store.records import RecordedEvent

    rows = big_call()[0][:6000]
    big = [RecordedEvent(r[1], r[2], i + 1, r[3], r[4], r[5], r[6], r[7])
           for i, r in enumerate(rows)]
    for recs in (chain("support-1", support_call()), chain("reissue-1", reissued_call()), big):
        for cut in (len(recs) // 3, len(recs) // 2 + 7, len(recs)):
            s = fold(recs[:cut])
            view = state_view(s)
            assert {c["tool_call_id"]: c["in_current_session"] for c in view["tool_calls"]} == {
                c.call_id: in_model(s, c) for c in s.calls.values()}
            assert view["to_send"] == [c.call_id for c in undelivered(s)]
            assert view["unanswered"] == [c.call_id for c in unanswered(s)]
    trimmed = state_view(fold(big), max_items=10)
    assert len(trimmed["tool_calls"]) >= 10 and trimmed["tool_calls_total"] > 600
    assert len(trimmed["conversation"]) == 10


def test_a_reissued_call_takes_its_originals_outcome():
    recs = chain("reissue-1", reissued_call())
    tl = build_timeline(recs, final_state=fold(recs))
    c1, c2 = tl.tool_calls["c1"], tl.tool_calls["c2"]
    assert (c1.superseded_by, c2.reissue_of) == ("c2", "c1")
    assert (c2.outcome, c2.result, c2.reused_from, c2.attempts) == (
        "completed", {"booked": True}, "c1", [])
    # Sent, and nothing after it on that session: no sign the model has it.
    assert c2.sent_via == "tool_response" and c2.in_model is None
    assert c2.in_model_words == "not shown"
    assert tl.entries[7].summary.startswith("c2: Gemini asked again for c1")
    assert [p["kind"] for p in tl.problems] == ["disconnected:error"]


def test_events_after_the_close_are_flagged():
    timed = support_call() + [(5100, ev.BotStartedSpeaking(3))]
    tl = build_timeline(chain("support-1", timed))
    assert tl.problems == [{"version": 26, "at_us": T0 + 5_100_000, "kind": "event_after_close",
                            "detail": {"type": "speech.bot_started", "closed_at_version": 25}}]


def test_a_trimmed_state_view_keeps_every_unsettled_call():
    """The web inspector shows the latest `max_items` calls plus every call not settled: an
    early call that never got its answer must not fall out of the view with the old ones."""
    from session_store.audit import state_view

    timed = [(0, ev.SessionOpened("gemini-live", ["book"], "w1")), (0, ev.Connected(1)),
             (10, ev.ToolCallRequested("early", "book", {}, 1))]
    for i in range(5):
        timed += [(100 + i, ev.ToolCallRequested(f"c{i}", "book", {}, 1)),
                  (100 + i, ev.ToolCallStarted(f"c{i}", 1, f"k{i}", 1)),
                  (100 + i, ev.ToolCallCompleted(f"c{i}", "ok")),
                  (100 + i, ev.ToolResultSending(f"c{i}", 1, "tool_response")),
                  (100 + i, ev.ToolResultSent(f"c{i}", 1, "tool_response"))]
    view = state_view(fold(chain("trim-1", timed)), max_items=2)
    assert [c["tool_call_id"] for c in view["tool_calls"]] == ["early", "c3", "c4"]
    assert view["unanswered"] == ["early"] and view["tool_calls_total"] == 6


def test_a_call_ends_with_its_in_doubt_and_twice_delivered_calls_listed():
    """With the final state, the timeline lists what the call ended with: a call in doubt
    (started by a worker that died) and a result the model holds twice (I2 broken)."""
    opened = [(0, ev.SessionOpened("gemini-live", ["book"], "w1", 1)), (0, ev.Connected(1))]
    doubt = opened + [(100, ev.ToolCallRequested("c1", "book", {"room": 1}, 1)),
                      (110, ev.ToolCallStarted("c1", 1, "d:c1", 1)),
                      (500, ev.WorkerAttached("w2", 2, "takeover"))]
    recs = chain("doubt-1", doubt)
    tl = build_timeline(recs, final_state=fold(recs))
    assert [(p["kind"], p["detail"]["tool_call_id"]) for p in tl.problems] == [
        ("unanswered", "c1"), ("in_doubt", "c1")]
    assert tl.problems[1] == {"version": 5, "at_us": T0 + 500_000, "kind": "in_doubt",
                              "detail": {"tool_call_id": "c1", "name": "book"}}
    twice = opened + [(100, ev.ToolCallRequested("c1", "book", {}, 1)),
                      (110, ev.ToolCallStarted("c1", 1, "d:c1", 1)),
                      (200, ev.ToolCallCompleted("c1", "done")),
                      (210, ev.ToolResultSending("c1", 1, "tool_response")),
                      (220, ev.ToolResultSent("c1", 1, "tool_response")),
                      (300, ev.ToolResultSending("c1", 1, "content")),
                      (310, ev.ToolResultSent("c1", 1, "content"))]
    recs = chain("twice-1", twice)
    tl = build_timeline(recs, final_state=fold(recs))
    assert [(p["kind"], p["detail"]) for p in tl.problems] == [
        ("sent_more_than_once", {"tool_call_id": "c1", "sends_in_model": 2})]


def test_a_call_that_ends_disconnected_lists_its_last_reconnect_as_not_done():
    """A disconnect with no connection after it (a shutdown, or the call ends mid-reconnect)
    is still a row of the reconnects table: "(not reconnected)". A refused resumption
    (`handshake_failed`) is a problem, as an error is."""
    timed = [(0, ev.SessionOpened("gemini-live", [], "w1", 1)), (0, ev.Connected(1)),
             (100, ev.Disconnected(1, "handshake_failed", "1008 invalid handle")),
             (200, ev.Connected(2)),
             (300, ev.Disconnected(2, "shutdown"))]
    tl = build_timeline(chain("end-1", timed))
    assert [(r.reason, r.from_generation, r.generation, r.disconnected_version,
             r.connected_version) for r in tl.reconnects] == [
        ("handshake_failed", 1, 2, 3, 4), ("shutdown", 2, None, 5, None)]
    assert [(p["version"], p["kind"]) for p in tl.problems] == [
        (3, "disconnected:handshake_failed")]
    assert tl.entries[2].level == "error" and tl.entries[4].level == "warn"


def test_wait_is_to_the_first_start_and_run_from_the_last():
    """A call re-run after a takeover (attempt 2): it waited from its request to its first
    start; it ran from its last start to its outcome."""
    timed = [(0, ev.SessionOpened("gemini-live", ["book"], "w1", 1)), (0, ev.Connected(1)),
             (100, ev.ToolCallRequested("c1", "book", {}, 1)),
             (150, ev.ToolCallStarted("c1", 1, "k", 1)),
             (1000, ev.WorkerAttached("w2", 2, "takeover")),
             (1100, ev.ToolCallStarted("c1", 2, "k", 2)),
             (1400, ev.ToolCallCompleted("c1", "booked"))]
    tl = build_timeline(chain("retry-1", timed))
    c1 = tl.tool_calls["c1"]
    assert (c1.wait_ms, c1.run_ms, c1.started_at_us) == (50.0, 300.0, T0 + 150_000)
    assert [a["attempt"] for a in c1.attempts] == [1, 2]
    assert tl.entries[5].summary == "c1: book started (attempt 2) after waiting 50 ms"


def test_speech_segments_and_lanes_of_odd_events():
    """A second "started" without a "stopped" closes the first segment ("restarted"); an
    event type this code does not know goes on the errors lane."""
    timed = [(0, ev.SessionOpened("gemini-live", [], "w1", 1)), (0, ev.Connected(1)),
             (100, ev.BotStartedSpeaking(1)), (400, ev.BotStartedSpeaking(1)),
             (600, ev.BotStoppedSpeaking(1))]
    recs = chain("speech-1", timed)
    tl = build_timeline(recs)
    assert [(s.start_version, s.end_version, s.duration_ms, s.end_source) for s in tl.speech] == [
        (3, 4, 300.0, "restarted"), (4, 5, 200.0, "turn_complete")]
    from dataclasses import replace
    odd = build_timeline(recs[:1] + [replace(recs[1], type="future.event")])
    assert [(e.lane, e.level) for e in odd.entries] == [("session", "info"), ("errors", "error")]


def _render(renderable) -> str:
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_the_text_views_say_what_the_json_says():
    """The text timeline lists events in version order and says "NO" for a result that is
    not in the model; the state table says which sends were confirmed ("sent")."""
    from session_store.audit import state_view
    from session_store.audit.text import state_view_text, timeline_view

    recs = chain("support-1", support_call())
    text = _render(timeline_view(build_timeline(recs, call_id="support-1",
                                                final_state=fold(recs))))
    rows = [line.split()[0] for line in text.splitlines()
            if line.strip() and line.split()[0].isdigit() and "  " in line]
    assert rows[:25] == [str(v) for v in range(1, 26)], rows
    cut = recs[:13]  # c1 completed (v12), its send not confirmed yet (v13)
    text = _render(timeline_view(build_timeline(cut, final_state=fold(cut))))
    [c1] = [line for line in text.splitlines() if line.split()[:1] == ["c1"]]
    assert c1.split()[-3:] == ["not", "sent", "NO"], c1
    state = _render(state_view_text(state_view(fold(cut))))
    assert "tool_response g1 v13 not confirmed" in state, state
    done = _render(state_view_text(state_view(fold(recs[:14]))))
    assert "tool_response g1 v13 sent" in done and "v13 not confirmed" not in done, done


def test_a_late_disconnect_of_an_old_generation_does_not_end_speech():
    """The close of a connection already replaced (generation 1, logged after generation 2
    came up) does not cut the bot's turn on the new one."""
    timed = [(0, ev.SessionOpened("gemini-live", [], "w1", 1)), (0, ev.Connected(1)),
             (200, ev.Connected(2)), (300, ev.BotStartedSpeaking(2)),
             (350, ev.Disconnected(1, "error", "late close")),
             (600, ev.BotStoppedSpeaking(2))]
    tl = build_timeline(chain("late-1", timed))
    assert [(s.generation, s.start_version, s.duration_ms, s.end_source) for s in tl.speech] == [
        (2, 4, 300.0, "turn_complete")]
