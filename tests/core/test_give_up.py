"""Giving up on Gemini, decided on the log (decide.gives_up): connection failures in a row
(failed handshakes, sessions lost to an error before any server message) are counted by the
fold on the log's clock, so a takeover and replay judge the same window; the give-up is
logged once, and no reconnect is due after it until a takeover or a session comes up."""

from __future__ import annotations

from session_store import events as ev
from session_store.audit.replay import logged_decisions, replay
from session_store.decide import (GIVE_UP_FAILURES, HandshakeFailed, SessionLeft,
                                  SessionReady, decide)
from session_store.delivery import Reconnect, due
from session_store.policy import Policy

from .helpers import T0_US, Log, opened

ALL = Policy()
WINDOW_S = 30.0
S = 1_000_000


def failed(log: Log, at_s: float, window_s: float | None = WINDOW_S) -> list[ev.Event]:
    """A fresh handshake fails at `at_s` (from T0): decided and logged, as the driver does."""
    at = T0_US + int(at_s * S)
    decided = decide(log.state(), HandshakeFailed(None, "1011 unavailable", 1011,
                                                  give_up_after_s=window_s), ALL, at)
    log.add(*decided, at_us=at)
    return decided


def given_up(events: list[ev.Event]) -> list[ev.AnomalyRecorded]:
    return [e for e in events if isinstance(e, ev.AnomalyRecorded)
            and e.kind == "connection_given_up"]


def reconnects(log: Log) -> list[Reconnect]:
    return [x for x in due(log.state(), ALL, log.now_us) if isinstance(x, Reconnect)]


def lost_session() -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1), at_us=T0_US)
    return log


def test_failures_in_a_row_are_given_up_only_once_the_window_has_passed():
    log = lost_session()
    log.add(ev.Disconnected(1, "error"), at_us=T0_US)  # (heard: the run starts here)
    for at_s in (1, 5, 29.9):
        assert not given_up(failed(log, at_s)), at_s
    assert log.state().failures_in_row == 4 and log.state().failing_since_us == T0_US
    assert reconnects(log)
    decided = failed(log, 30.0)
    [anomaly] = given_up(decided)
    assert anomaly.detail["failures"] == 5 and anomaly.detail["failing_for_s"] == 30.0
    assert anomaly.detail["window_s"] == WINDOW_S and anomaly.generation == 1
    assert log.state().given_up and reconnects(log) == []
    # Once: a late failure (a handshake already under way) decides nothing more.
    assert not given_up(failed(log, 31.0))


def test_a_zero_window_gives_up_at_the_third_failure_as_pipecat_did():
    log = Log()
    log.add(opened(), at_us=T0_US)
    outcomes = [bool(given_up(failed(log, 0.1 * n, window_s=0.0))) for n in range(3)]
    assert outcomes == [False] * (GIVE_UP_FAILURES - 1) + [True]


def test_a_takeover_during_the_failures_does_not_restart_the_window():
    log = Log()
    log.add(opened(), at_us=T0_US)
    failed(log, 0.0)
    failed(log, 10.0)
    log.add(ev.WorkerAttached("w2", 2), at_us=T0_US + 20 * S)
    s = log.state()
    assert (s.failures_in_row, s.failing_since_us) == (2, T0_US)
    assert given_up(failed(log, 31.0)), "the new worker started a window of its own"


def test_a_takeover_after_the_give_up_tries_again_within_the_same_run():
    log = Log()
    log.add(opened(), at_us=T0_US)
    for at_s in (0, 15, 30):
        failed(log, at_s)
    assert log.state().given_up and reconnects(log) == []
    log.add(ev.WorkerAttached("w2", 2), at_us=T0_US + 40 * S)
    assert reconnects(log) == [Reconnect("takeover")]
    # Its first failure is still in the old run: given up again at once.
    assert given_up(failed(log, 41.0))


def test_a_session_that_got_a_message_ends_the_run():
    log = Log()
    log.add(opened(), at_us=T0_US)
    failed(log, 0.0)
    failed(log, 10.0)
    log.add(ev.Connected(1), at_us=T0_US + 20 * S)
    left = decide(log.state(), SessionLeft(1, "error", heard=True, give_up_after_s=WINDOW_S,
                                           error="1011"), ALL, T0_US + 40 * S)
    assert left == [ev.Disconnected(1, "error", "1011", heard=True)]
    log.add(*left, at_us=T0_US + 40 * S)
    s = log.state()
    assert (s.failures_in_row, s.failing_since_us) == (1, T0_US + 40 * S)
    assert not given_up(failed(log, 45.0))


def test_sessions_lost_before_any_message_continue_the_run_and_are_given_up_on_leaving():
    """setupComplete alone is no progress (a server that accepts every setup and closes each
    session at once): the receive loop's loss is decided with its Disconnected, so the log
    says the session was left even when that loss gives the connection up."""
    log = Log()
    log.add(opened(), at_us=T0_US)
    failed(log, 0.0)
    failed(log, 10.0)
    log.add(ev.Connected(1), at_us=T0_US + 20 * S)
    at = T0_US + 31 * S
    left = decide(log.state(), SessionLeft(1, "error", heard=False, give_up_after_s=WINDOW_S,
                                           error="1011"), ALL, at)
    assert left[0] == ev.Disconnected(1, "error", "1011", heard=False)
    [anomaly] = given_up(left)
    assert anomaly.detail["failures"] == 3 and anomaly.detail["failing_for_s"] == 31.0
    log.add(*left, at_us=at)
    assert not log.state().connected and reconnects(log) == []


def test_a_planned_leave_judges_nothing_and_a_new_session_clears_the_give_up():
    log = Log()
    log.add(opened(), at_us=T0_US)
    for at_s in (0, 15, 30):
        failed(log, at_s)
    log.add(ev.Connected(1), at_us=T0_US + 40 * S)
    assert not log.state().given_up
    left = decide(log.state(), SessionLeft(1, "settings", heard=False,
                                           give_up_after_s=WINDOW_S), ALL, T0_US + 90 * S)
    assert left == [ev.Disconnected(1, "settings", heard=False)]


def test_older_logs_keep_the_shells_give_up():
    """Before the window was observed, the shell gave up itself: no decision is made on such
    an observation, and the shell's anomaly stops reconnects all the same."""
    log = Log()
    log.add(opened(), at_us=T0_US)
    for at_s in (0, 15, 30, 60):
        assert not given_up(failed(log, at_s, window_s=None))
    log.add(ev.AnomalyRecorded("connection_given_up", {"failures": 4}, 0))
    assert log.state().given_up and reconnects(log) == []


def observed(log: Log, obs, at_s: float, decided: list[ev.Event] | None = None) -> None:
    """`obs` logged as the service logs it (the observation, then what was decided on it),
    with `decided` in place of decide's own events if given (a shell that decided itself)."""
    log.observe(obs, ALL, at_us=T0_US + int(at_s * S), decided=decided)


def outage(window_s: float | None) -> Log:
    log = lost_session()
    observed(log, SessionLeft(1, "error", give_up_after_s=window_s), 0.0)
    for at_s in (1, 15, 31):
        observed(log, HandshakeFailed(None, "1011 unavailable", 1011,
                                      give_up_after_s=window_s), at_s)
    return log


def test_the_give_up_is_replayed_and_a_log_that_went_on_regardless_diverges():
    log = outage(WINDOW_S)
    assert log.state().given_up
    report = replay(log.records())
    n = len(list(logged_decisions(log.records())))
    assert report.ok and report.coverage == f"{n} of {n} decisions replayed", report.coverage
    # A shell that did not give up (its own clock restarted by a takeover, say) logged the
    # last failure without the outcome: replay says so.
    kept_on = outage(WINDOW_S)
    kept_on.events, kept_on.times = kept_on.events[:-3], kept_on.times[:-3]
    last = HandshakeFailed(None, "1011 unavailable", 1011, give_up_after_s=WINDOW_S)
    handshake_only = [e for e in decide(kept_on.state(), last, ALL, T0_US + 31 * S)
                      if not (isinstance(e, ev.AnomalyRecorded) and e.kind == "connection_given_up")]
    observed(kept_on, last, 31.0, handshake_only)
    [wrong] = replay(kept_on.records()).divergences
    assert "connection_given_up" in str(wrong.decided), wrong


def test_a_log_with_the_shells_give_up_replays_as_before():
    log = outage(None)  # (observations as the older service logged them: no window)
    assert not log.state().given_up
    log.add(ev.AnomalyRecorded("connection_given_up", {"failures": 4}, 1),
            ev.SessionClosed("gemini_unreachable"), at_us=T0_US + 31 * S + 1)
    report = replay(log.records())
    n = len(list(logged_decisions(log.records())))
    assert report.ok and report.coverage == f"{n} of {n} decisions replayed", report.coverage


def test_a_session_opened_after_the_give_up_diverges_on_replay():
    """The retry that follows a failed handshake is a reconnect `due` asks for: one opened
    after the failure that gave the connection up is not, and replay says so."""
    log = outage(WINDOW_S)
    assert log.state().given_up
    log.observe(SessionReady(2, None, "ab" * 32), ALL, at_us=T0_US + 32 * S)
    [wrong] = replay(log.records()).divergences
    assert wrong.kind == "due" and "the connection was given up" in wrong.message, wrong
    # Before the give-up, the same retry is due: replayed as is.
    retried = lost_session()
    observed(retried, SessionLeft(1, "error", give_up_after_s=WINDOW_S), 0.0)
    observed(retried, HandshakeFailed(None, "1011 unavailable", 1011,
                                      give_up_after_s=WINDOW_S), 1.0)
    retried.observe(SessionReady(2, None, "ab" * 32), ALL, at_us=T0_US + 2 * S)
    report = replay(retried.records())
    assert report.ok and report.effects_checked >= 1, report.to_json()


ENDS = Policy(end_call_on_give_up="gemini_unreachable")


def test_a_policy_that_ends_the_call_on_give_up_closes_it_with_the_give_up():
    """The call's end is decided with the give-up (Policy.end_call_on_give_up), in the same
    decision, on a failed handshake and on a session lost to an error alike; replay decides
    it again, and a replay with a policy that does not end calls says the log did."""
    log = lost_session()
    log.observe(SessionLeft(1, "error", give_up_after_s=WINDOW_S), ENDS, at_us=T0_US)
    for at_s in (1, 15):
        log.observe(HandshakeFailed(None, "1011", 1011, give_up_after_s=WINDOW_S), ENDS,
                    at_us=T0_US + at_s * S)
    last = log.observe(HandshakeFailed(None, "1011", 1011, give_up_after_s=WINDOW_S), ENDS,
                       at_us=T0_US + 31 * S)
    assert given_up(last) and last[-1] == ev.SessionClosed("gemini_unreachable")
    s = log.state()
    assert s.closed and s.given_up and reconnects(log) == []
    report = replay(log.records(), ENDS)
    n = len(list(logged_decisions(log.records())))
    assert report.ok and report.coverage == f"{n} of {n} decisions replayed", report.coverage
    [wrong] = replay(log.records(), ALL).divergences
    assert wrong.kind == "decide" and "session.closed" in wrong.message, wrong

    # A session lost to an error, before any message, past the window: left, given up, ended.
    lost = Log()
    lost.add(opened(), at_us=T0_US)
    for at_s in (0, 10):
        lost.observe(HandshakeFailed(None, "1011", 1011, give_up_after_s=WINDOW_S), ENDS,
                     at_us=T0_US + at_s * S)
    lost.add(ev.Connected(1), at_us=T0_US + 20 * S)
    left = lost.observe(SessionLeft(1, "error", heard=False, give_up_after_s=WINDOW_S),
                        ENDS, at_us=T0_US + 31 * S)
    assert isinstance(left[0], ev.Disconnected) and given_up(left)
    assert left[-1] == ev.SessionClosed("gemini_unreachable")


def test_without_the_option_the_call_stays_open_for_the_app_to_end():
    log = outage(WINDOW_S)
    assert log.state().given_up and not log.state().closed


def test_the_reason_to_end_with_is_text():
    import pytest

    for bad in ("", 3, True):
        with pytest.raises(ValueError, match="end_call_on_give_up"):
            Policy(end_call_on_give_up=bad)
