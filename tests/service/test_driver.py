"""CallDriver: the service's only path to the log (no pipecat here), on both databases.

It folds what it appends itself (stamped with the time the store records) instead of reading
it back, merges follow-up decisions into the same commit, and queues facts noted on the audio
path; none of that may make its state differ from the fold of the log.
"""

from __future__ import annotations

import asyncio

import pytest

from service.driver import CallDriver
from session_store import Policy, load_state
from session_store import events as ev
from session_store.decide import FunctionCall, SpeechStarted, ToolCallsArrived
from session_store.delivery import (Reconnect, SendResult, StartCall, due, unanswered,
                                    undelivered)
from session_store.errors import Fenced, StoreUnavailable
from session_store.projection import to_snapshot


async def same_as_log(driver: CallDriver) -> None:
    stored = await load_state(driver.store, driver.call_id, use_snapshot=False)
    assert to_snapshot(driver.state) == to_snapshot(stored)


STARTS = frozenset({StartCall})


async def test_state_is_exactly_the_fold_of_the_log(store):
    driver = CallDriver(store, "call-a", Policy(), worker_id="w1")
    await driver.attach(model="m", tools=["lookup_order"], settings={})
    await driver.record(ev.Connected(1, None, "x"))
    driver.note(SpeechStarted(1, "model"))
    driver.note(ev.HandleIssued(1, "h1", None))
    started = await driver.observe(
        ToolCallsArrived((FunctionCall("c1", "lookup_order", {"id": 1}),), 1), intend=STARTS)
    # Speaking when the call arrived (noted first): deferred, so nothing started.
    assert not started.intents
    started = await driver.record(ev.BotStoppedSpeaking(1, "transport"), intend=STARTS)
    assert [type(e).__name__ for e in started.events] == ["BotStoppedSpeaking",
                                                          "ToolCallStarted"]
    await driver.record(ev.ToolCallCompleted("c1", {"ok": True}),
                        intend=frozenset({SendResult}))
    await driver.record(ev.ToolResultSent("c1", 1, "tool_response"))
    await same_as_log(driver)
    types = [r.type for r in await store.read("call-a")]
    # Each observation that decided something is logged before what it decided.
    assert types == ["session.opened", "connection.connected", "decision.observed",
                     "speech.bot_started", "connection.handle_issued", "decision.observed",
                     "tool.call_requested", "tool.call_deferred",
                     "speech.bot_stopped", "tool.call_started", "tool.call_completed",
                     "tool.result_sending", "tool.result_sent"]


async def test_a_record_and_what_it_lets_happen_share_one_commit(store):
    driver = CallDriver(store, "call-b", Policy(defer="none"), worker_id="w1")
    await driver.attach(model="m", tools=["t"], settings={})
    await driver.record(ev.Connected(1, None, "x"))
    before = store.stats["batches"]
    started = await driver.observe(
        ToolCallsArrived((FunctionCall("c1", "t", {}), FunctionCall("c2", "t", {"a": 1})), 1),
        intend=STARTS)
    assert store.stats["batches"] == before + 1
    assert [e.call_id for e in started.intents] == ["c1", "c2"]
    recs = (await store.read("call-b"))[-4:]
    assert len({r.recorded_at_us for r in recs}) == 1
    await same_as_log(driver)


async def test_notes_are_kept_when_an_append_fails(store):
    driver = CallDriver(store, "call-c", Policy(), worker_id="w1")
    await driver.attach(model="m", tools=["t"], settings={})
    await driver.record(ev.Connected(1, None, "x"))
    # Another writer moves the stream behind the driver's back (not a newer worker).
    await store.append("call-c", [ev.ConversationMessage("user", "hi", 1)], 2, epoch=1)
    driver.note(ToolCallsArrived((FunctionCall("c1", "t", {}),), 1))
    with pytest.raises(Exception):
        await driver.observe()
    assert driver.has_notes, "a noted tool call must not be lost with the failed append"
    assert driver.due() == [], "nothing is due from a state the log may not hold"
    await driver.observe()  # re-reads the log, decides the note again
    assert driver.state.calls["c1"].status == "requested"
    await same_as_log(driver)


async def test_a_takeover_sees_its_own_state_only_once_attached(store):
    first = CallDriver(store, "call-d", Policy(), worker_id="w1")
    await first.attach(model="m", tools=["t"], settings={})
    await first.record(ev.Connected(1, None, "x"))
    second = CallDriver(store, "call-d", Policy(), worker_id="w2")
    state = await second.attach(model="m", tools=["t"], settings={})
    assert state.epoch == 2 and not state.connected and state is second.state
    await same_as_log(second)
    with pytest.raises(Exception):
        await first.record(ev.ConversationMessage("user", "late", 1))
    assert first.fenced


async def test_a_fact_the_log_cannot_store_becomes_an_anomaly_not_a_stuck_log(store):
    """The SDK lets NaN and lone surrogates through; the log's JSON refuses them. Such a
    noted fact used to fail its append, be noted again, and fail every append after it."""
    driver = CallDriver(store, "call-e", Policy(), worker_id="w1")
    await driver.attach(model="m", tools=["t"], settings={})
    await driver.record(ev.Connected(1, None, "x"))
    driver.note(ev.ConversationMessage("assistant", "caf\udce9", 1))
    driver.note(ev.HandleIssued(1, "h1", None))
    await driver.observe()
    await driver.record(ev.ConversationMessage("user", "still logging", 1))
    types = [r.type for r in await store.read("call-e")]
    assert types[-3:] == ["anomaly.recorded", "connection.handle_issued", "conversation.message"]
    (anomaly,) = [r for r in await store.read("call-e") if r.type == "anomaly.recorded"]
    assert anomaly.data["kind"] == "unstorable_event"
    assert anomaly.data["detail"]["type"] == "conversation.message"
    assert "\\udce9" in anomaly.data["detail"]["preview"]
    await same_as_log(driver)


async def test_an_append_that_committed_under_a_cancelled_caller_is_not_made_twice(store):
    """A reconnect cancelled the receive loop while it awaited an append: the store's writer
    committed it anyway. The noted facts it carried must not be appended again."""
    driver = CallDriver(store, "call-f", Policy(), worker_id="w1")
    await driver.attach(model="m", tools=["t"], settings={})
    real_append = store.append

    async def committed_then_cancelled(*args, **kwargs):
        await real_append(*args, **kwargs)
        raise asyncio.CancelledError

    driver.note(ev.HandleIssued(1, "h1", None))
    store.append = committed_then_cancelled
    try:
        with pytest.raises(asyncio.CancelledError):
            await driver.record(ev.Connected(1, None, "x"))
    finally:
        store.append = real_append
    driver.note(ev.HandleIssued(1, "h2", None))
    await driver.observe()
    handles = [r.data["handle"] for r in await store.read("call-f")
               if r.type == "connection.handle_issued"]
    assert handles == ["h1", "h2"]
    await same_as_log(driver)


async def test_an_append_that_failed_keeps_its_notes(store):
    driver = CallDriver(store, "call-g", Policy(), worker_id="w1")
    await driver.attach(model="m", tools=["t"], settings={})
    real_append = store.append

    async def refused(*args, **kwargs):
        raise asyncio.CancelledError  # cancelled before the store took it

    driver.note(ev.HandleIssued(1, "h1", None))
    store.append = refused
    try:
        with pytest.raises(asyncio.CancelledError):
            await driver.record(ev.Connected(1, None, "x"))
    finally:
        store.append = real_append
    await driver.observe()
    assert [r.type for r in await store.read("call-g")][-1] == "connection.handle_issued"
    await same_as_log(driver)


async def test_snapshots_are_compacted_and_a_takeover_loads_from_them(store):
    """The driver snapshots every `snapshot_every` events; a new worker loads the compacted
    decision state from it and reloads the whole log only when a fresh session needs it."""
    policy = Policy(defer="none", crossing_window_s=0)  # calls settle for good at once
    first = CallDriver(store, "long", policy, worker_id="w1", snapshot_every=25)
    await first.attach(model="m", tools=["lookup"], settings={})
    await first.record(ev.Connected(1, None, "x"))
    for turn in range(12):
        cid = f"c{turn}"
        await first.record(ev.ConversationMessage("user", f"question {turn}", 1))
        await first.observe(ToolCallsArrived((FunctionCall(cid, "lookup", {"t": turn}),), 1),
                            intend=STARTS)
        await first.record(ev.ToolCallCompleted(cid, {"answer": turn}),
                           intend=frozenset({SendResult}))
        await first.record(ev.ToolResultSent(cid, 1, "tool_response"),
                           ev.HandleIssued(1, f"h{turn}", None))
    await first._snapshot_task
    snapshot = await store.load_snapshot("long")  # which one depends on timing: one is saved
    assert snapshot is not None and snapshot.version >= 25   # at a time, none is ever waited for

    second = CallDriver(store, "long", policy, worker_id="w2")
    state = await second.attach(model="m", tools=["lookup"], settings={})
    assert not state.history_complete and state.archived
    full = await load_state(store, "long", use_snapshot=False)
    assert second.due() == due(full, policy, 0) and not unanswered(state)
    assert second.resumption_handle() == "h11"
    # Resuming the newest handle needs nothing compaction left out.
    await second.record(ev.Connected(2, "h11", "x"))
    assert not second.state.history_complete and not undelivered(second.state)

    # A fresh session lacks every archived result: the driver folds the whole log, and the
    # seed then has them all.
    third = CallDriver(store, "long", policy, worker_id="w3")
    await third.attach(model="m", tools=["lookup"], settings={})
    await third.record(ev.Connected(3, None, "x"))
    assert third.state.history_complete
    assert {c.call_id for c in undelivered(third.state)} == {f"c{t}" for t in range(12)}
    await same_as_log(third)
    await second.ensure_history()  # fenced or not, it can always read the history
    assert second.state.history_complete and second.state.messages == 12


async def test_a_stale_worker_that_rereads_a_newer_epoch_is_fenced(store):
    """A worker whose append failed (the database partitioned away from it) is stale: its
    next commit re-reads the log first. If a newer worker took the call over meanwhile, that
    re-read loads the newer worker's state; with nothing of its own to append, the stale
    worker was never fenced and `due()` handed it the newer worker's effects (a Reconnect
    resuming the very handle the newer worker resumes)."""
    old = CallDriver(store, "zombie", Policy(), worker_id="old")
    await old.attach(model="m", tools=["t"], settings={})
    await old.record(ev.Connected(1, None, "x"), ev.HandleIssued(1, "h1", None))

    real_append = store.append

    async def partitioned(*args, **kwargs):
        raise StoreUnavailable("the database did not answer (partition)")

    store.append = partitioned
    try:
        with pytest.raises(StoreUnavailable):
            await old.record(ev.ConversationMessage("user", "said during the partition", 1))
    finally:
        store.append = real_append
    assert old.stale

    # The supervisor gave the old worker up; a new one takes the call over.
    new = CallDriver(store, "zombie", Policy(), worker_id="new")
    await new.attach(model="m", tools=["t"], settings={})
    assert new.due() == [Reconnect("takeover")]
    assert new.resumption_handle() == "h1"

    # The partition heals; the old worker's notes task flushes (nothing noted): it re-reads
    # the log, which now belongs to epoch 2.
    try:
        await old.observe()
    except Fenced:
        pass
    effects = old.due()
    assert old.fenced and effects == [], (
        f"the old worker (epoch {old.epoch}) re-read the log of epoch {old.state.epoch} and "
        f"was not fenced: it is handed {effects} (resuming {old.resumption_handle()!r}, the "
        "handle the new worker resumes)")
