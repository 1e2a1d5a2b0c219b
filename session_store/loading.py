"""Load a call's state from the log: the newest usable snapshot plus the events after it."""

from __future__ import annotations

from .projection import (CROSSING_WINDOW_US, HANDLE_TTL_US, PROJECTION_VERSION, HistoryNeeded,
                         SessionState, compact, fold_into, from_snapshot, to_snapshot)
from .storage import Snapshot, SqlEventStore


async def load_state(store: SqlEventStore, stream_id: str, *, use_snapshot: bool = True,
                     to_version: int | None = None) -> SessionState:
    """Fold the stream (up to `to_version`), starting from a snapshot when one fits.

    From a snapshot the state is compacted (`history_complete` is False: no conversation,
    calls settled for good archived by id): the decision state. Readers that show or export
    the whole call pass `use_snapshot=False`. If an event after the snapshot needs what
    compaction left out (a fresh session, an archived call), the whole log is folded."""
    if use_snapshot and to_version is None:
        snap = await store.load_snapshot(stream_id)
        if snap is not None and snap.projection_version == PROJECTION_VERSION:
            state = from_snapshot(snap.state_json)
            tail = await store.read(stream_id, from_version=state.version + 1)
            try:
                # Built here and owned by no one else: fold in place, no copy.
                return fold_into(state, tail)
            except HistoryNeeded:
                pass
    state = SessionState(stream_id=stream_id)
    return fold_into(state, await store.read(stream_id, to_version=to_version))


async def save_snapshot(store: SqlEventStore, state: SessionState, *,
                        handle_ttl_us: int = HANDLE_TTL_US,
                        crossing_window_us: int = CROSSING_WINDOW_US) -> None:
    """Store the compacted state (bounded however long the call; see projection.compact).
    Serialised before the first await: the caller may go on changing `state`."""
    text = to_snapshot(compact(state, handle_ttl_us=handle_ttl_us,
                               crossing_window_us=crossing_window_us))
    await store.save_snapshot(Snapshot(state.stream_id, state.version, PROJECTION_VERSION, text))
