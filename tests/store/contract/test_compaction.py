"""Compacted snapshots through the store: load_state starts from a saved snapshot only when it
may (same projection version, compacted for this policy), and folds the whole log when a
later event needs what compaction left out. The properties of `compact` itself, without a
database: tests/core/test_compaction.py."""

from __future__ import annotations

from session_store import events as ev
from session_store.storage.loading import load_state, save_snapshot
from session_store.compaction import compact
from session_store.projection import PROJECTION_VERSION, to_snapshot
from session_store.storage import Snapshot

from ..helpers import sql
from ...core.test_compaction import decisions, long_call, probes_for
from session_store.delivery import undelivered


async def test_load_state_falls_back_to_the_whole_log_when_a_later_event_needs_it(store):
    recs = long_call(20)
    events = [r.event for r in recs]
    for r in recs:  # each at its own time: the early calls are past the crossing window
        await store.append("long", [r.event], r.version - 1, recorded_at_us=r.recorded_at_us)
    full = await load_state(store, "long", use_snapshot=False)
    await save_snapshot(store, full)
    from_snap = await load_state(store, "long")
    assert not from_snap.history_complete and from_snap.archived
    assert decisions(from_snap, probes_for(full))["due"] == decisions(full, [])["due"]
    # A fresh session after the snapshot: the compacted state cannot say what it lacks.
    await store.append("long", [ev.Disconnected(full.generation, "error"),
                                ev.Connected(full.generation + 1, None)], len(events))
    loaded = await load_state(store, "long")
    assert loaded.history_complete
    assert loaded.to_json() == (await load_state(store, "long", use_snapshot=False)).to_json()
    assert {c.call_id for c in undelivered(loaded)} == {f"c{t}" for t in range(1, 21)}

async def test_a_snapshot_compacted_for_a_shorter_policy_is_not_started_from(store):
    """A worker whose policy has a wider crossing window (or keeps handles longer) than the
    worker that saved the snapshot must not decide from it: the snapshot archived calls (or
    left out handles) this worker's decisions still look at, e.g. a repeat of a call answered
    as content a few seconds ago would no longer be recognised as one that crossed it."""
    recs = long_call(20)
    for r in recs:
        await store.append("long", [r.event], r.version - 1, recorded_at_us=r.recorded_at_us)
    full = await load_state(store, "long", use_snapshot=False)
    narrow = 1  # µs: every settled call is past it, so all are archived
    await save_snapshot(store, full, crossing_window_us=narrow)
    # The worker with the narrow window starts from it, and it holds fewer calls ...
    short = await load_state(store, "long", crossing_window_us=narrow)
    assert not short.history_complete
    wide = compact(full)  # the default window
    assert wide.calls.keys() - short.calls.keys()
    # ... the one with the default window folds the log: its state still has them.
    loaded = await load_state(store, "long")
    assert loaded.calls.keys() >= wide.calls.keys()
    # A state compacted twice remembers the narrower of the two.
    assert compact(compact(full, crossing_window_us=narrow)).compacted_with[1] == narrow

async def test_a_snapshot_of_another_projection_version_is_never_started_from(store, migrated):
    """A snapshot saved by code whose fold meant something else (another PROJECTION_VERSION,
    older or newer) is not this code's state: it is ignored and the log folded, so the answer
    is always the fold from zero."""
    recs = long_call(5)
    for r in recs:
        await store.append("long", [r.event], r.version - 1, recorded_at_us=r.recorded_at_us)
    full = await load_state(store, "long", use_snapshot=False)
    other = compact(full)
    other.model, other.bot_speaking = "what-another-fold-made-of-it", not full.bot_speaking
    for version in (PROJECTION_VERSION - 1, PROJECTION_VERSION + 1):
        await sql(migrated, "DELETE FROM session_snapshots")
        await store.save_snapshot(Snapshot("long", full.version, version, to_snapshot(other)))
        loaded = await load_state(store, "long")
        assert loaded.history_complete  # folded from zero, not started from the snapshot
        assert loaded.to_json() == full.to_json()

async def test_an_event_naming_an_archived_call_loads_from_the_whole_log(store):
    """After the snapshot, an event names a call the snapshot archived (here a late
    confirmation of its send): the compacted state cannot apply it, so load_state folds the
    whole log, and the state is the fold from zero, not an error."""
    recs = long_call(20)
    for r in recs:
        await store.append("long", [r.event], r.version - 1, recorded_at_us=r.recorded_at_us)
    await save_snapshot(store, await load_state(store, "long", use_snapshot=False))
    assert "c1" in (await load_state(store, "long")).archived
    await store.append("long", [ev.ToolResultSent("c1", 1, "tool_response")], len(recs))
    loaded = await load_state(store, "long")
    assert loaded.history_complete and loaded.version == len(recs) + 1
    assert loaded.to_json() == (await load_state(store, "long", use_snapshot=False)).to_json()

async def test_a_session_resumed_from_a_handle_compaction_left_out_loads_the_whole_log(store):
    """After the snapshot a session resumes from an old handle (one compaction left out: a
    newer one could be chosen). Its model state lacks results the snapshot archived as
    delivered, so only the whole log can say what to send again: load_state folds it."""
    recs = long_call(20)
    for r in recs:
        await store.append("long", [r.event], r.version - 1, recorded_at_us=r.recorded_at_us)
    full = await load_state(store, "long", use_snapshot=False)
    await save_snapshot(store, full)
    assert "h2" not in (await load_state(store, "long")).handles
    await store.append("long", [ev.Disconnected(full.generation, "error"),
                                ev.Connected(full.generation + 1, "h2")], len(recs))
    loaded = await load_state(store, "long")
    assert loaded.history_complete
    assert loaded.to_json() == (await load_state(store, "long", use_snapshot=False)).to_json()
    assert {c.call_id for c in undelivered(loaded)} >= {f"c{t}" for t in range(3, 9)}
