"""A handle the server refused (`connection.handle_refused`): the fold marks it, the choice of
handle skips it for every worker (a takeover included), and compaction, which keeps only the
handles that can still be chosen, looks past it to the older one."""

from __future__ import annotations

from session_store import events as ev
from session_store.compaction import compact
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
