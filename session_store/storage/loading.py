"""Load a call's state from the log: the newest usable snapshot plus the events after it."""

from __future__ import annotations

import logging

from ..compaction import compact
from ..policy import CROSSING_WINDOW_US, HANDLE_TTL_US
from ..projection import PROJECTION_VERSION, fold_into, from_snapshot, to_snapshot
from ..state import HistoryNeeded, SessionState
from . import Snapshot, SqlEventStore

log = logging.getLogger(__name__)


async def snapshot_state(store: SqlEventStore, stream_id: str,
                         max_version: int | None = None, *,
                         handle_ttl_us: int = HANDLE_TTL_US,
                         crossing_window_us: int = CROSSING_WINDOW_US) -> SessionState | None:
    """The state cached in the stream's snapshot, if it is one this code can trust.

    A snapshot is only a cache: the log is the truth. One that does not parse, that names
    another stream or version than its row, or that covers events the log does not hold
    (rows deleted after it was taken) is ignored with a warning, and the caller folds the
    log instead: the answer is then the log's, never the damaged cache's. So is one
    compacted for a shorter handle lifetime or crossing window than the caller's policy
    (`handle_ttl_us`, `crossing_window_us`): a worker with another policy saved it, and it
    left out handles or calls this one's decisions still look at.
    """
    snap = await store.load_snapshot(stream_id)
    if snap is None or snap.projection_version != PROJECTION_VERSION:
        return None
    if max_version is not None and snap.version > max_version:
        return None
    try:
        state = from_snapshot(snap.state_json)
        if (state.stream_id, state.version) != (stream_id, snap.version):
            raise ValueError(f"it holds {state.stream_id!r}@{state.version}")
    except Exception as exc:  # noqa: BLE001 - any unreadable cache is ignored, loudly
        log.warning("ignoring the snapshot of %r at version %s: it cannot be read (%s: %s); "
                    "folding the log instead", stream_id, snap.version, type(exc).__name__, exc)
        return None
    kept = state.compacted_with
    if kept is not None and (handle_ttl_us > kept[0] or crossing_window_us > kept[1]):
        log.info("not starting %r from its snapshot at version %s: compacted for a handle "
                 "lifetime / crossing window of %s / %s us, this policy needs %s / %s us; "
                 "folding the log instead", stream_id, snap.version, kept[0], kept[1],
                 handle_ttl_us, crossing_window_us)
        return None
    if snap.version and not await store.read(stream_id, from_version=snap.version,
                                             to_version=snap.version):
        log.warning("ignoring the snapshot of %r at version %s: the log has no event %s "
                    "(rows deleted after it was taken?); folding the log instead",
                    stream_id, snap.version, snap.version)
        return None
    return state


async def load_state(store: SqlEventStore, stream_id: str, *, use_snapshot: bool = True,
                     to_version: int | None = None, handle_ttl_us: int = HANDLE_TTL_US,
                     crossing_window_us: int = CROSSING_WINDOW_US) -> SessionState:
    """Fold the stream (up to `to_version`), starting from a snapshot when one fits.

    From a snapshot the state is compacted (`history_complete` is False: no conversation,
    calls settled for good archived by id): the decision state, for a policy that looks no
    further back than `handle_ttl_us` / `crossing_window_us` (pass the policy's). Readers
    that show or export the whole call pass `use_snapshot=False`. If an event after the
    snapshot needs what compaction left out (a fresh session, an archived call), the whole
    log is folded."""
    if use_snapshot and to_version is None:
        state = await snapshot_state(store, stream_id, handle_ttl_us=handle_ttl_us,
                                     crossing_window_us=crossing_window_us)
        if state is not None:
            tail = await store.read(stream_id, from_version=state.version + 1)
            try:
                # Built here and owned by no one else: fold in place, no copy.
                return fold_into(state, tail)
            except HistoryNeeded:
                pass
    state = SessionState(stream_id=stream_id)
    return fold_into(state, await store.read(stream_id, to_version=to_version))


def snapshot_of(state: SessionState, *, handle_ttl_us: int = HANDLE_TTL_US,
                crossing_window_us: int = CROSSING_WINDOW_US) -> Snapshot:
    """The snapshot of `state`: its compacted form (bounded however long the call; see
    compaction.compact), serialised now, so the caller may go on changing `state`."""
    text = to_snapshot(compact(state, handle_ttl_us=handle_ttl_us,
                               crossing_window_us=crossing_window_us))
    return Snapshot(state.stream_id, state.version, PROJECTION_VERSION, text)


async def save_snapshot(store: SqlEventStore, state: SessionState, *,
                        handle_ttl_us: int = HANDLE_TTL_US,
                        crossing_window_us: int = CROSSING_WINDOW_US) -> None:
    """Store the snapshot of `state` (serialised before the first await)."""
    await store.save_snapshot(snapshot_of(state, handle_ttl_us=handle_ttl_us,
                                          crossing_window_us=crossing_window_us))
