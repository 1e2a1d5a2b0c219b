"""A send that failed (decide.SendFailed): a closed socket is the receive loop's to report
and replace; any other failure is logged and replaces the live session at once, even
mid-turn (the socket cannot be trusted with the next send), decided on the log."""

from __future__ import annotations

from session_store import events as ev
from session_store.audit.replay import replay
from session_store.decide import SendFailed, SessionLeft, SessionReady, decide
from session_store.delivery import SEND_FAILED, Reconnect, due
from session_store.policy import Policy

from .helpers import Log, opened

ALL = Policy()


def speaking() -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1), ev.BotStartedSpeaking(1))
    return log


def test_a_send_that_failed_on_a_live_socket_replaces_the_session_at_once():
    log = speaking()
    decided = decide(log.state(), SendFailed(1, "result", False, "RuntimeError: boom"), ALL)
    anomaly, request = decided
    assert (anomaly.kind, anomaly.generation) == ("send_failed", 1)
    assert anomaly.detail == {"what": "result", "error": "RuntimeError: boom"}
    assert request == ev.ReconnectRequested(SEND_FAILED)
    log.add(*decided)
    # The bot is speaking: a settings reconnect would wait for the turn; this one does not.
    assert Reconnect(SEND_FAILED) in due(log.state(), ALL, log.now_us)
    # Another failure before the new session asks nothing more (it is asked already).
    again = decide(log.state(), SendFailed(1, "cut_note", False, "RuntimeError: boom"), ALL)
    assert [type(e) for e in again] == [ev.AnomalyRecorded]


def test_a_closed_socket_is_left_to_the_receive_loop():
    assert decide(speaking().state(), SendFailed(1, "result", True, "ConnectionClosed"),
                  ALL) == []


def test_a_failure_on_a_session_already_left_is_only_logged():
    log = speaking()
    log.add(ev.Disconnected(1, "go_away"), ev.Connected(2))
    old = decide(log.state(), SendFailed(1, "seed", False, "RuntimeError: late"), ALL)
    assert [e.kind for e in old if isinstance(e, ev.AnomalyRecorded)] == ["send_failed"]
    assert len(old) == 1
    log.add(ev.Disconnected(2, "error"))  # no live session: the reconnect is due anyway
    assert len(decide(log.state(), SendFailed(2, "result", False, "x"), ALL)) == 1


def test_a_pending_reconnect_that_would_wait_is_made_urgent():
    log = speaking()
    log.add(ev.SettingsChanged(["voice"], {"voice": "Puck"}, True, False),
            ev.ReconnectRequested("settings", ["voice"]))
    assert not any(isinstance(x, Reconnect) for x in due(log.state(), ALL, log.now_us))
    log.add(*decide(log.state(), SendFailed(1, "context_update", False, "x"), ALL))
    s = log.state()
    assert Reconnect(SEND_FAILED) in due(s, ALL, log.now_us)
    assert s.reconnect_keys == ["voice"]  # the settings still go with the new session


def left_for_a_failed_send(failure: SendFailed | None) -> Log:
    """A live session, `failure` observed on it (None: nothing failed), then the session
    left for a failed send and the next one opened, each logged as the driver logs it."""
    log = Log()
    log.add(opened())
    log.observe(SessionReady(1, None, "ab" * 32), ALL)
    if failure is not None:
        log.observe(failure, ALL)
    log.observe(SessionLeft(1, SEND_FAILED), ALL)
    log.observe(SessionReady(2, None, "ab" * 32), ALL)
    return log


def test_a_session_left_for_a_failed_send_is_checked_as_the_reconnect_it_asked_for():
    log = left_for_a_failed_send(SendFailed(1, "result", False, "RuntimeError: x"))
    report = replay(log.records())
    assert report.ok, report.to_json()
    # The Disconnected and the Connected are both checked as effects of the log's state.
    assert report.effects_checked >= 2, report.to_json()


def test_a_session_left_for_a_failed_send_that_asked_for_none_diverges():
    """A shell that reconnected on a failure the log did not decide a reconnect for (none
    at all, or one on a closed socket, which is the receive loop's)."""
    for failure in (None, SendFailed(1, "result", True, "ConnectionClosedError: 1011")):
        log = left_for_a_failed_send(failure)
        [wrong] = replay(log.records()).divergences
        assert wrong.kind == "due" and "reconnects (send_failed)" in wrong.message, wrong
        assert "no send on it failed" in wrong.message, wrong
