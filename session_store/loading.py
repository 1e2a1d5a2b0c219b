"""Load a call's state from the log: the newest usable snapshot plus the events after it."""

from __future__ import annotations

from .projection import PROJECTION_VERSION, SessionState, fold_into, from_snapshot, to_snapshot
from .storage import Snapshot, SqlEventStore


async def load_state(store: SqlEventStore, stream_id: str, *, use_snapshot: bool = True,
                     to_version: int | None = None) -> SessionState:
    """Fold the stream (up to `to_version`), starting from a snapshot when one fits."""
    state = SessionState(stream_id=stream_id)
    if use_snapshot and to_version is None:
        snap = await store.load_snapshot(stream_id)
        if snap is not None and snap.projection_version == PROJECTION_VERSION:
            state = from_snapshot(snap.state_json)
    tail = await store.read(stream_id, from_version=state.version + 1, to_version=to_version)
    # The state was built here and belongs to no one else: fold in place, no copy.
    return fold_into(state, tail)


async def save_snapshot(store: SqlEventStore, state: SessionState) -> None:
    await store.save_snapshot(Snapshot(state.stream_id, state.version, PROJECTION_VERSION,
                                       to_snapshot(state)))
