"""Decisions that used to be made in the service's shell — what an arriving result is (an
unknown id, a second result, a value the log cannot store, an intermediate result dropped),
whether a failed handshake passes its handle over, whether a handle is issued or
withheld, and what the caller heard (messages, late words, cuts) — are observations decided on the log
by the driver, on both databases: a worker that takes over folds what they decided, and
`replay` decides each again (its coverage counts them)."""

from __future__ import annotations

import dataclasses

from service.driver import CallDriver
from session_store import Policy, load_state
from session_store import events as ev
from session_store.audit import replay
from session_store.audit.replay import logged_decisions
from session_store.decide import (FunctionCall, HandleArrived, HandshakeFailed,
                                  InterruptionObserved, ModelOutputObserved, ProgressReturned,
                                  ResultArrived, SendFailed, SessionReady, ToolCallsArrived,
                                  TranscriptFlushed)
from session_store.heard import CUT_MARK
from session_store.delivery import SEND_FAILED, Reconnect, StartCall
from session_store.state import Withholding
from session_store.storable import Unstorable

NEW_KINDS = {"ResultArrived", "ProgressReturned", "HandshakeFailed"}


async def replayed_in_full(store, call_id: str, policy: Policy) -> list[str]:
    """The kinds of the call's logged decisions, once replay decided every one the same."""
    records = await store.read(call_id)
    report = replay(records, policy)
    decisions = list(logged_decisions(records))
    assert report.ok, report.to_json()
    assert report.coverage == f"{len(decisions)} of {len(decisions)} decisions replayed"
    return [d.kind for d in decisions]


async def test_shell_decisions_are_logged_replayed_and_seen_by_the_next_worker(store):
    policy = Policy(defer="none")
    first = CallDriver(store, "call-s", policy, worker_id="w1")
    await first.attach(model="m", tools=["lookup", "track"], settings={})
    await first.observe(SessionReady(1, None, "ab" * 32))
    await first.record(ev.HandleIssued(1, "h1", None))
    await first.observe(ToolCallsArrived((FunctionCall("c1", "lookup", {"id": 1}),
                                          FunctionCall("c2", "lookup", {"id": 2}),
                                          FunctionCall("c3", "lookup", {"id": 3})), 1),
                        intend=frozenset({StartCall}))
    assert {c.status for c in first.state.calls.values()} == {"started"}
    await first.observe(ResultArrived("c1", "lookup", {"ok": 1}))
    await first.observe(ResultArrived("c1", "lookup", {"ok": "again"}))  # a second result
    await first.observe(ResultArrived("zz", "lookup", {"ok": 0}))  # no such call
    await first.observe(ResultArrived("c2", "lookup", {"v": float("nan")}))
    await first.observe(ResultArrived("c3", "lookup", Unstorable("RecursionError: deep")))
    await first.observe(ProgressReturned("c1", {"p": 1}, "SILENT", "lookup"))  # dropped
    await first.record(ev.Disconnected(1, "error"))
    await first.observe(HandshakeFailed("h1", "1011 internal error", 1011))

    calls = first.state.calls
    assert (calls["c1"].status, calls["c2"].status, calls["c3"].status) == \
        ("completed", "failed", "failed")
    assert not first.state.handles["h1"].refused and first.state.handshake_failures == {"h1": 1}

    # The next worker counts the failure its predecessor logged: one more passes h1 over.
    second = CallDriver(store, "call-s", policy, worker_id="w2")
    await second.attach(model="m", tools=["lookup", "track"], settings={})
    assert second.state.handshake_failures == {"h1": 1}
    decision = await second.observe(HandshakeFailed("h1", "1011 internal error", 1011))
    assert ev.HandleRefused(1, "h1", "failing", 2) in decision.events
    assert second.resumption_handle("h1") is None  # fresh, seeded

    records = await store.read("call-s")
    stored = await load_state(store, "call-s", use_snapshot=False)
    assert stored.handles["h1"].refused
    anomalies = [r.data["kind"] for r in records if r.type == "anomaly.recorded"]
    assert anomalies.count("second_result") == anomalies.count("result_for_unknown_call") == 1
    assert anomalies.count("unstorable_event") == 2
    assert anomalies.count("intermediate_result_dropped") == 1
    assert anomalies.count("handshake_failed") == 2

    report = replay(records, policy)
    decisions = list(logged_decisions(records))
    n = len(decisions)
    assert report.ok, report.to_json()
    assert report.coverage == f"{n} of {n} decisions replayed" and not report.reconstructed
    kinds = [d.kind for d in decisions]
    assert NEW_KINDS <= set(kinds), kinds
    assert kinds.count("ResultArrived") == 5 and kinds.count("HandshakeFailed") == 2


async def test_a_changed_rule_for_handshakes_shows_in_replay(store):
    """Replay is not vacuous for the new kinds: a log whose handshake decision differs from
    today's (here: a refusal that did not pass its handle over) diverges."""
    policy = Policy()
    driver = CallDriver(store, "call-t", policy, worker_id="w1")
    await driver.attach(model="m", tools=["lookup"], settings={})
    await driver.observe(SessionReady(1, None, "ab" * 32))
    await driver.record(ev.HandleIssued(1, "h1", None), ev.Disconnected(1, "error"))
    await driver.observe(HandshakeFailed("h1", "1008 not found", 1008, "not found"))
    records = await store.read("call-t")
    at = next(i for i, r in enumerate(records) if r.type == "connection.handle_refused")
    # Drop the refusal and the decision's count of events with it: the log now says the
    # refused handle was kept.
    observed = records[at - 2]
    assert observed.type == "decision.observed"
    assert '"events":2' in observed.data_json
    forged = [*records[:at - 2], dataclasses.replace(
        observed, data_json=observed.data_json.replace('"events":2', '"events":1')),
        records[at - 1]]
    report = replay(forged, policy)
    assert not report.ok and report.divergences[0].kind == "decide", report.to_json()


async def test_handles_are_decided_on_the_gate_the_next_worker_folds(store):
    """The handles' gate (withholding.py) as the driver logs it: what the service notes
    (a send unread, the model's reaction, a session holding all) rides the next commit, a
    handle is decided on the gate with those notes in, and the next worker folds that gate."""
    policy = Policy()
    first = CallDriver(store, "call-g", policy, worker_id="w1")
    await first.attach(model="m", tools=["lookup"], settings={})
    await first.observe(SessionReady(1, None, "ab" * 32))
    first.note(ev.HoldsAll(1))
    first.note(ev.SendUnread(1, turn_under_way=False))
    assert first.gate() == Withholding(0, 1, False)  # noted, not committed: the gate ahead
    versions = first.state.version
    decision = await first.observe(HandleArrived(1, "h-crossing"))
    assert decision.events[1:] == [ev.HandleWithheld(1, "h-crossing")]
    assert first.state.version == versions + 4  # the notes, the observation, its event
    assert first.state.withholding == Withholding(0, 1, False)

    second = CallDriver(store, "call-g", policy, worker_id="w2")
    await second.attach(model="m", tools=["lookup"], settings={})
    assert second.state.withholding == Withholding(0, 1, False)
    await second.observe(SessionReady(2, None, "ab" * 32))
    second.note(ev.SendUnread(2, turn_under_way=True))
    # The model output is an observation decided on the gate: the earlier turn's output
    # moves nothing (and logs nothing), its end and the next turn's output do.
    second.note(ModelOutputObserved(2, reaction=True))
    second.note(ModelOutputObserved(2, turn_ended=True))
    assert second.gate() == Withholding(0, 2, False)
    assert (await second.observe(HandleArrived(2, "h-a"))).events[1:] == [
        ev.HandleWithheld(2, "h-a")]
    second.note(ModelOutputObserved(2, reaction=True))
    assert (await second.observe(HandleArrived(2, "h-b", 3))).events[1:] == [
        ev.HandleIssued(2, "h-b", 3)]

    kinds = await replayed_in_full(store, "call-g", policy)
    assert kinds.count("HandleArrived") == 3 and kinds.count("ModelOutputObserved") == 2
    records = await store.read("call-g")
    assert [r.type for r in records if r.type in (
        "connection.earlier_turn_ended", "connection.model_reacted")] == [
        "connection.earlier_turn_ended", "connection.model_reacted"]
    stored = await load_state(store, "call-g", use_snapshot=False)
    assert stored.withholding == Withholding(2, 0, False) and list(stored.handles) == ["h-b"]


async def test_a_log_whose_gate_moved_otherwise_diverges_on_replay(store):
    """Replay decides the model output again: a log that says the model reacted where
    today's rule says its output was the earlier turn's diverges."""
    policy = Policy()
    driver = CallDriver(store, "call-m", policy, worker_id="w1")
    await driver.attach(model="m", tools=["lookup"], settings={})
    await driver.observe(SessionReady(1, None, "ab" * 32))
    driver.note(ev.SendUnread(1, turn_under_way=True))
    await driver.observe(ModelOutputObserved(1, turn_ended=True))
    records = await store.read("call-m")
    assert (await replayed_in_full(store, "call-m", policy)).count("ModelOutputObserved") == 1
    ended = records[-1]
    assert ended.type == "connection.earlier_turn_ended"
    # A shell that took the end of the turn under way as the model's reaction.
    forged = [*records[:-1], dataclasses.replace(ended, type="connection.model_reacted")]
    report = replay(forged, policy)
    assert not report.ok and report.divergences[0].kind == "decide", report.to_json()


async def test_a_failed_send_is_decided_on_the_log_and_its_reconnect_seen_by_the_next_worker(
        store):
    """A send that failed on a live socket (decide.SendFailed): the anomaly and the reconnect
    it asks for are logged, so the next worker finds the reconnect due and replay checks it;
    one on a closed socket decides nothing (the receive loop reports the close)."""
    policy = Policy()
    first = CallDriver(store, "call-f", policy, worker_id="w1")
    await first.attach(model="m", tools=["lookup"], settings={})
    await first.observe(SessionReady(1, None, "ab" * 32))
    closed = await first.observe(SendFailed(1, "result", True, "ConnectionClosedError: 1011"))
    assert closed.events == []
    decision = await first.observe(SendFailed(1, "result", False, "RuntimeError: wedged"))
    assert decision.events[-1] == ev.ReconnectRequested(SEND_FAILED)
    assert Reconnect(SEND_FAILED) in first.due()

    second = CallDriver(store, "call-f", policy, worker_id="w2")
    await second.attach(model="m", tools=["lookup"], settings={})
    assert second.state.reconnect_pending == SEND_FAILED

    assert (await replayed_in_full(store, "call-f", policy)).count("SendFailed") == 1


async def test_what_the_caller_heard_is_decided_on_the_log_and_replayed(store):
    """The transcript and the interruptions as the service observes them (decide.
    TranscriptFlushed, InterruptionObserved): the messages, the late words and the cuts are
    decided on the log, the finished message a barge-in cuts is the fold's, and replay
    decides each again."""
    policy = Policy()
    first = CallDriver(store, "call-h", policy, worker_id="w1")
    await first.attach(model="models/gemini-3.8-live", tools=[], settings={})
    await first.observe(SessionReady(1, None, "ab" * 32))
    said = "one two three four five six seven eight nine ten"
    await first.observe(TranscriptFlushed(1, (("Tell me", None),), said))
    assert first.state.uncut_answer == (said, 1)
    # The caller's late words, then a local barge-in over the finished turn still playing.
    await first.observe(TranscriptFlushed(1, ((" the code word?", 0.8), ("Stop", 5.0))))
    cut = await first.observe(InterruptionObserved(1, local=True, finished_turn_heard=0.3))
    assert cut.events[1:] == [ev.Interrupted(1),
                              ev.ConversationMessageCut("one two three" + CUT_MARK, 1)]
    # A second barge-in over the same audio: nothing left to cut, nothing logged.
    assert (await first.observe(InterruptionObserved(1, local=True,
                                                     finished_turn_heard=0.4))).events == []
    # Gemini interrupts the next turn a quarter into its audio.
    await first.observe(InterruptionObserved(1))
    await first.observe(TranscriptFlushed(1, said="Sorry, as I was saying", heard_fraction=0.25))

    second = CallDriver(store, "call-h", policy, worker_id="w2")
    await second.attach(model="models/gemini-3.8-live", tools=[], settings={})
    assert second.state.conversation == [
        ("user", "Tell me"), ("user", "the code word?"),
        ("assistant", "one two three" + CUT_MARK), ("user", "Stop"),
        ("assistant", "Sorry," + CUT_MARK)]
    assert second.state.uncut_answer is None

    kinds = await replayed_in_full(store, "call-h", policy)
    assert kinds.count("TranscriptFlushed") == 3 and kinds.count("InterruptionObserved") == 2


async def test_a_log_whose_shell_cut_otherwise_diverges_at_that_decision(store):
    """Replay is not vacuous for what the caller heard: a log whose cut of the finished turn
    differs from today's (the shell cut it to more words than played) diverges there."""
    policy = Policy()
    driver = CallDriver(store, "call-c", policy, worker_id="w1")
    await driver.attach(model="models/gemini-3.8-live", tools=[], settings={})
    await driver.observe(SessionReady(1, None, "ab" * 32))
    await driver.observe(TranscriptFlushed(1, said="one two three four"))
    await driver.observe(InterruptionObserved(1, local=True, finished_turn_heard=0.5))
    records = await store.read("call-c")
    at = next(i for i, r in enumerate(records) if r.type == "conversation.message_cut")
    cut = records[at]
    forged = [*records[:at], dataclasses.replace(
        cut, data_json=cut.data_json.replace("one two —", "one two three —"))]
    assert forged[-1].data_json != cut.data_json
    report = replay(forged, policy)
    assert not report.ok, report.to_json()
    (divergence,) = report.divergences
    assert divergence.kind == "decide" and divergence.observation["observation"] == \
        "InterruptionObserved"
