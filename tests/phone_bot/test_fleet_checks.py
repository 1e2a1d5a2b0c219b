"""The fleet verdict's takeover checks can fail: each is shown a record of a takeover with one
thing wrong (the killed worker wrote after the takeover, ran a tool after the kill, talked to
Gemini after the takeover; the call never came back) and must say so."""

from __future__ import annotations

import json

from examples.phone_bot.fleet import CallOutcome, Kill, Worker, _check_takeover
from examples.phone_bot.telephony import Balancer, PhoneCall, Stream
from service.local_live import ClientMessage, Connection
from session_store.records import RecordedEvent

KILL_AT = 1_000.0
OLD, NEW = "http://127.0.0.1:1", "http://127.0.0.1:2"


def record(version: int, type_: str, at: float, **data) -> RecordedEvent:
    return RecordedEvent("CA1", version, version, type_, 1, json.dumps(data), int(at * 1e6), "")


def takeover_records() -> list[RecordedEvent]:
    return [record(1, "session.opened", KILL_AT - 5, worker="vm:111:aa"),
            record(2, "tool.call_requested", KILL_AT - 1, call_id="refund_order-1"),
            record(3, "session.worker_attached", KILL_AT + 0.5, worker="vm:222:bb", epoch=2),
            record(4, "connection.connected", KILL_AT + 0.6, generation=2)]


class View:
    def __init__(self, connections):
        self.connections = connections


def connections(late_message: bool = False) -> View:
    old = Connection(0, "/ws", KILL_AT - 5)
    old.received.append(ClientMessage(1, "realtime_input", {}, KILL_AT - 0.1))
    if late_message:
        old.received.append(ClientMessage(2, "tool_response", {}, KILL_AT + 0.7))
    new = Connection(1, "/ws", KILL_AT + 0.55)
    new.received.append(ClientMessage(1, "realtime_input", {}, KILL_AT + 0.8))
    return View([old, new])


def call(*, came_back: bool = True) -> PhoneCall:
    c = PhoneCall(Balancer("https://bot.invalid", [OLD, NEW]), "https://bot.invalid/twiml",
                  "+15550001000")
    first = Stream("MZ1", OLD, KILL_AT - 5, closed_at=KILL_AT + 0.01, ended_by="bot")
    c.streams.append(first)
    if came_back:
        second = Stream("MZ2", NEW, KILL_AT + 0.3)
        second.media.append((KILL_AT + 1.2, 320))
        c.streams.append(second)
    return c


def check(phone_call=None, records=None, view=None, ledger=()) -> CallOutcome:
    kill = Kill("CA1", "refund_order", "tool.call_requested", 0.0, worker=0, pid=111, at=KILL_AT)
    fleet = [Worker(0, 1, None, None), Worker(1, 2, None, None)]
    outcome = CallOutcome("CA1", "+15550001000", [0, 1], True, [])
    _check_takeover(outcome, phone_call or call(), kill, fleet,
                    records if records is not None else takeover_records(),
                    view or connections(), list(ledger))
    return outcome


def test_a_clean_takeover_passes_and_is_measured():
    outcome = check()
    assert outcome.problems == []
    assert round(outcome.gap_s, 3) == 1.2 and round(outcome.takeover_s, 3) == 0.5
    assert round(outcome.redirect_s, 3) == 0.3


def test_an_event_of_the_killed_worker_after_the_takeover_is_flagged():
    late = record(5, "tool.result_sent", KILL_AT - 0.2, call_id="refund_order-1")
    problems = check(records=[*takeover_records(), late]).problems
    assert any(p.startswith("I6: v5 tool.result_sent was stamped before the kill") for p in problems)


def test_a_tool_run_by_the_killed_process_after_the_kill_is_flagged():
    problems = check(ledger=[{"tool": "refund_order", "pid": 111, "at": KILL_AT + 0.1}]).problems
    assert problems == ["I6: the killed worker ran refund_order after the kill"]


def test_a_message_on_the_killed_workers_gemini_connection_after_the_takeover_is_flagged():
    problems = check(view=connections(late_message=True)).problems
    assert problems == ["I6: Gemini connection 0 (opened before the kill) received 1 messages "
                        "after the takeover"]


def test_a_call_that_never_came_back_is_flagged():
    assert check(phone_call=call(came_back=False)).problems == [
        "no new stream after the kill: the call did not continue"]


def test_a_takeover_by_the_killed_process_or_none_is_flagged():
    same = takeover_records()
    same[2] = record(3, "session.worker_attached", KILL_AT + 0.5, worker="vm:111:cc", epoch=2)
    assert "the call was taken over by the killed process" in check(records=same).problems
    none = [r for r in takeover_records() if r.type != "session.worker_attached"]
    assert check(records=none).problems == [
        "no worker took the call over in the log (no session.worker_attached after the kill)"]


def test_a_call_the_killed_worker_had_logged_nothing_of_is_opened_afresh_by_the_next():
    """Killed before its first append: the next worker finds no stream and opens the call. That
    is the takeover; a worker_attached is not expected, and an opening is still required."""
    afresh = [record(1, "session.opened", KILL_AT + 0.5, worker="vm:222:bb"),
              record(2, "connection.connected", KILL_AT + 0.6, generation=1)]
    outcome = check(records=afresh)
    assert outcome.problems == [] and round(outcome.takeover_s, 3) == 0.5
    assert check(records=afresh[1:]).problems == [
        "no worker took the call over in the log (no session.opened after the kill)"]


def test_a_call_logged_before_the_kill_and_opened_again_is_not_a_takeover():
    """Once the killed worker logged the call, only an attach continues it: a second opening
    would be a new call under the same id, and the verdict says so."""
    reopened = [r for r in takeover_records() if r.type != "session.worker_attached"]
    reopened.append(record(3, "session.opened", KILL_AT + 0.5, worker="vm:222:bb"))
    assert check(records=reopened).problems == [
        "no worker took the call over in the log (no session.worker_attached after the kill)"]
