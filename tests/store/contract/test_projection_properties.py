"""Snapshots through the store: load_state from a snapshot equals the full fold, a snapshot
of another projection version is never used, and an older one never replaces a newer one.
The fold's own properties, without a database: tests/core/test_projection_properties.py."""

from __future__ import annotations

import copy


from session_store import events as ev
from session_store.storage.loading import load_state, save_snapshot
from session_store.compaction import compact
from session_store.projection import (PROJECTION_VERSION, evolve, fold, fold_into, from_snapshot,
                                      to_snapshot)
from session_store.storage import Snapshot


async def test_load_state_with_snapshot_equals_full_fold(store):
    stream = [ev.SessionOpened("m", ["lookup"], "w1", 1), ev.Connected(1),
              ev.HandleIssued(1, "h0")]
    for i in range(12):
        stream += [ev.ToolCallRequested(f"c{i}", "lookup", {"i": i}, 1),
                   ev.ToolCallStarted(f"c{i}", 1, f"k{i}", 1),
                   ev.ToolCallCompleted(f"c{i}", {"r": i}),
                   ev.ToolResultSending(f"c{i}", 1, "tool_response")]
    await store.append("call", stream[:25], 0)
    await save_snapshot(store, await load_state(store, "call", use_snapshot=False))
    snap = await store.load_snapshot("call")
    assert (snap.version, snap.projection_version) == (25, PROJECTION_VERSION)
    await store.append("call", stream[25:], 25)

    with_snapshot = await load_state(store, "call")
    without = await load_state(store, "call", use_snapshot=False)
    assert with_snapshot.version == without.version == len(stream)
    # The snapshot holds the compacted state (tests/store/contract/test_compaction.py): here nothing
    # is settled for good (no send confirmed), so only the conversation is left out.
    records = await store.read("call")
    expected = fold_into(from_snapshot(to_snapshot(compact(fold(records[:25])))), records[25:])
    assert with_snapshot.to_json() == expected.to_json()
    assert not with_snapshot.history_complete and with_snapshot.conversation == [
        ("tool", f"c{i}") for i in range(6, 12)]
    assert {**with_snapshot.to_json(), "conversation": [], "history_complete": True,
            "compacted_with": None} == {
        **without.to_json(), "conversation": []}
    assert (await load_state(store, "call", to_version=10)).to_json() == fold(
        (await store.read("call"))[:10]).to_json()

async def test_snapshot_is_used_only_when_its_projection_version_matches(store):
    await store.append("call", [ev.SessionOpened("m", [], "w1"), ev.Connected(1)], 0)
    state = await load_state(store, "call")
    marked = copy.deepcopy(state)
    marked.anomalies = 999  # a marker only the snapshot has: shows whether it was used
    await store.save_snapshot(Snapshot("call", 2, PROJECTION_VERSION + 1, to_snapshot(marked)))
    assert (await load_state(store, "call")).anomalies == 0  # other version: ignored
    await store.append("call", [ev.ConversationMessage("user", "hi")], 2)
    await store.save_snapshot(Snapshot("call", 3, PROJECTION_VERSION - 1, to_snapshot(
        evolve(marked, (await store.read("call"))[2]))))
    assert (await load_state(store, "call")).anomalies == 0
    await store.append("call", [ev.ConversationMessage("user", "again")], 3)
    marked = evolve(evolve(marked, (await store.read("call"))[2]), (await store.read("call"))[3])
    await save_snapshot(store, marked)
    assert (await load_state(store, "call")).anomalies == 999  # this version: used
    assert (await load_state(store, "call", use_snapshot=False)).anomalies == 0
    await store.append("call", [ev.ConversationMessage("user", "more")], 4)
    loaded = await load_state(store, "call")
    assert loaded.anomalies == 999 and loaded.version == 5
    assert loaded.messages == 3 and not loaded.history_complete  # compacted: no conversation
    assert loaded.conversation == [("user", "more")]
    assert (await load_state(store, "call", use_snapshot=False)).conversation == [
        ("user", "hi"), ("user", "again"), ("user", "more")]

async def test_an_older_snapshot_never_replaces_a_newer_one(store):
    await store.append("call", [ev.SessionOpened("m", [], "w1"), ev.Connected(1),
                                ev.Connected(2)], 0)
    await save_snapshot(store, await load_state(store, "call", use_snapshot=False))
    old = fold((await store.read("call"))[:1])
    await save_snapshot(store, old)
    assert (await store.load_snapshot("call")).version == 3
