"""A handle the server refused (`connection.handle_refused`): the fold marks it, the choice of
handle skips it for every worker (a takeover included), and compaction, which keeps only the
handles that can still be chosen, looks past it to the older one."""

from __future__ import annotations

import pytest

from session_store import events as ev
from session_store.compaction import compact
from session_store.decide import (HANDLE_ATTEMPTS, REFUSING_CLOSE_CODES, HandshakeFailed, decide,
                                  handshake_verdict)
from session_store.delivery import choose_resumption
from session_store.policy import Policy
from session_store.projection import from_snapshot, to_snapshot

from .helpers import Log, opened

ALL = Policy()


def two_handles() -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1), ev.HandleIssued(1, "h1"), ev.HandleIssued(1, "h2"))
    return log


def test_the_fold_marks_a_refused_handle_and_ignores_one_it_does_not_hold():
    log = two_handles()
    log.add(ev.HandleRefused(1, "h2", "refused"), ev.HandleRefused(0, "h-other", "failing", 2))
    s = log.state()
    assert (s.handles["h1"].refused, s.handles["h2"].refused) == (False, True)
    assert "h-other" not in s.handles
    assert from_snapshot(to_snapshot(s)).handles["h2"].refused


def test_a_new_worker_passes_over_the_handle_its_predecessor_saw_refused():
    log = two_handles()
    log.add(ev.Disconnected(1, "error"), ev.HandleRefused(1, "h2", "refused"))
    log.add(ev.WorkerAttached("w2", 2, "crash"))  # the takeover: nothing in memory survives
    s = log.state()
    assert choose_resumption(s, ALL, log.now_us) == "h1"
    log.add(ev.HandleRefused(1, "h1", "failing", 2))
    assert choose_resumption(log.state(), ALL, log.now_us) is None  # fresh, seeded


def test_compaction_keeps_the_older_handle_a_refusal_leaves_choosable():
    log = two_handles()
    log.add(ev.Disconnected(1, "error"), ev.HandleRefused(1, "h2", "refused"))
    full = log.state()
    small = from_snapshot(to_snapshot(compact(full)))
    assert choose_resumption(small, ALL, log.now_us) == choose_resumption(full, ALL,
                                                                          log.now_us) == "h1"


# --------------------------------------------------------------------------- failed handshakes

def failed(log: Log, handle: str | None, code: int | None = 1011) -> list[ev.Event]:
    """decide on a failed handshake (closed with `code`), its events added to the log."""
    decided = decide(log.state(), HandshakeFailed(handle, f"{code} closed", code), ALL)
    log.add(*decided)
    return decided


@pytest.mark.parametrize("code", [1007, 1008])
def test_a_refusing_close_code_passes_its_handle_over_at_once(code):
    log = two_handles()
    log.add(ev.Disconnected(1, "error"))
    anomaly, refusal = failed(log, "h2", code)
    assert isinstance(anomaly, ev.AnomalyRecorded) and anomaly.kind == "handshake_failed"
    assert anomaly.detail == {"handle": "h2", "error": f"{code} closed", "close_code": code,
                              "handle_refused": True, "failures": 1, "passed_over": True}
    assert refusal == ev.HandleRefused(1, "h2", "refused", 1)
    assert choose_resumption(log.state(), ALL, log.now_us) == "h1"


@pytest.mark.parametrize("code", [1011, 1006, 1000, 503, None])
def test_any_other_close_or_none_says_nothing_about_the_handle(code):
    assert code not in REFUSING_CLOSE_CODES
    log = two_handles()
    log.add(ev.Disconnected(1, "error"))
    [anomaly] = failed(log, "h2", code)
    assert anomaly.detail["handle_refused"] is False and not anomaly.detail["passed_over"]
    assert ("close_code" in anomaly.detail) is (code is not None)


def test_an_older_logs_verdict_without_a_close_code_still_decides():
    """Logs written before the close code was observed hold only the shell's `refused`."""
    log = two_handles()
    log.add(ev.Disconnected(1, "error"))
    old = HandshakeFailed("h2", "1008 None. Requested entity was not found.", refused=True)
    assert decide(log.state(), old, ALL)[1:] == [ev.HandleRefused(1, "h2", "refused", 1)]
    kept = HandshakeFailed("h2", "1011 internal", refused=False)
    assert decide(log.state(), kept, ALL)[1:] == []


def test_transient_failures_pass_a_handle_over_only_after_handle_attempts_in_a_row():
    log = two_handles()
    log.add(ev.Disconnected(1, "error"))
    [first] = failed(log, "h2")
    assert first.detail["passed_over"] is False and log.state().handshake_failures == {"h2": 1}
    *_, refusal = failed(log, "h2")
    assert HANDLE_ATTEMPTS == 2 and refusal == ev.HandleRefused(1, "h2", "failing", 2)


def test_a_handshake_that_went_through_ends_the_failures_in_a_row():
    log = two_handles()
    log.add(ev.Disconnected(1, "error"))
    failed(log, "h2")
    log.add(ev.Connected(2, "h2"), ev.Disconnected(2, "error"))
    assert log.state().handshake_failures == {}
    [again] = failed(log, "h2")
    assert again.detail["failures"] == 1 and not again.detail["passed_over"]


def test_a_new_worker_counts_the_failures_its_predecessor_logged():
    log = two_handles()
    log.add(ev.Disconnected(1, "error"))
    failed(log, "h2")
    log.add(ev.WorkerAttached("w2", 2, "crash"))
    s = from_snapshot(to_snapshot(log.state()))  # (a snapshot keeps them too)
    assert s.handshake_failures == {"h2": 1}
    assert handshake_verdict(s, "h2", refused=False) == (2, True)
    *_, refusal = failed(log, "h2")
    assert refusal == ev.HandleRefused(1, "h2", "failing", 2)


def test_a_fresh_sessions_failed_handshake_passes_nothing_over():
    log = two_handles()
    log.add(ev.Disconnected(1, "error"))
    [anomaly] = failed(log, None, None)
    assert anomaly.detail == {"handle": None, "error": "None closed"}
    assert log.state().handshake_failures == {}
