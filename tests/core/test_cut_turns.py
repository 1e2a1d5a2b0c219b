"""A bot turn the caller heard only part of (`conversation.message_cut`): the fold replaces the
message and remembers the cut; no session resumes a model state holding the turn whole (the
handles of the generation that said it, from the turn before it on, and every session
resumed from them), so the next session is a fresh one seeded with the heard part; the cut
survives snapshots and compaction."""

from __future__ import annotations

from session_store import events as ev
from session_store.compaction import compact
from session_store.delivery import choose_resumption, seed_plan
from session_store.policy import Policy
from session_store.projection import from_snapshot, to_snapshot

from .helpers import Log, opened

ALL = Policy()
SAID = "Your refund is done and the receipt goes to your email now"
HEARD = "Your refund is done —"


def cut_call() -> Log:
    log = Log()
    log.add(opened(), ev.Connected(1), ev.ConversationMessage("user", "refund order 7", 1),
            ev.HandleIssued(1, "before-the-turn"),
            ev.ConversationMessage("assistant", SAID, 1), ev.HandleIssued(1, "after-the-turn"),
            ev.Interrupted(1), ev.ConversationMessageCut(HEARD, 1),
            ev.HandleIssued(1, "after-the-cut"))  # (the live session was never told)
    return log


def test_the_cut_replaces_the_message_and_the_seed_holds_what_was_heard():
    s = cut_call().state()
    assert s.conversation[-1] == ("assistant", HEARD) and s.messages == 2
    assert ("assistant", HEARD) in seed_plan(s).turns
    assert not [t for t in seed_plan(s).turns if SAID in t[1]]


def test_no_session_resumes_a_state_that_holds_the_whole_turn():
    log = cut_call()
    assert choose_resumption(log.state(), ALL, log.now_us) is None  # fresh, seeded
    # A session resumed from a handle issued before the cut turn lacks it: resumable where
    # the model takes the heard part as content.
    log = Log()
    log.add(opened(), ev.Connected(1), ev.ConversationMessage("user", "refund order 7", 1),
            ev.ConversationMessage("assistant", "Which order?", 1), ev.HandleIssued(1, "h1"),
            ev.ConversationMessage("user", "seven", 1),
            ev.ConversationMessage("assistant", SAID, 1), ev.HandleIssued(1, "h2"),
            ev.ConversationMessageCut(HEARD, 1))
    assert choose_resumption(log.state(), ALL, log.now_us) in (None, "h1")
    assert choose_resumption(log.state(), Policy(resumption="prefer"), log.now_us) != "h2"


def test_a_session_resumed_from_such_a_state_is_not_resumed_either():
    log = cut_call()
    log.add(ev.Disconnected(1, "error"), ev.Connected(2, handle="after-the-turn"),
            ev.HandleIssued(2, "gen2"))  # (resumed before the cut was logged elsewhere)
    assert choose_resumption(log.state(), ALL, log.now_us) is None


def test_a_turn_after_a_fresh_seed_is_resumable_again():
    log = cut_call()
    log.add(ev.Disconnected(1, "error"), ev.Connected(2), ev.HandleIssued(2, "fresh"))
    assert choose_resumption(log.state(), ALL, log.now_us) == "fresh"


def test_the_cut_survives_snapshots_and_compaction():
    log = cut_call()
    s = log.state()
    again = from_snapshot(to_snapshot(s))
    assert again.cut_turns == s.cut_turns and again.conversation == s.conversation
    compacted = from_snapshot(to_snapshot(compact(s)))
    assert compacted.cut_turns == s.cut_turns
    assert choose_resumption(compacted, ALL, log.now_us) is None
