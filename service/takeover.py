"""What a worker reads before it takes a call over: the log must lead to its head row, and
what the old worker committed meanwhile is folded in (CallDriver.attach).

Reads only; no pipecat. Raises StreamDamaged rather than take over a call from a partial log.
"""

from __future__ import annotations

from session_store import SessionState, load_state
from session_store.errors import StreamDamaged
from session_store.projection import HistoryNeeded, fold_into
from session_store.storage import SqlEventStore


async def catch_up(store: SqlEventStore, call_id: str, state: SessionState, version: int,
                   compaction: dict) -> tuple[SessionState, bool]:
    """`state` with the events up to `version` folded in: what the old worker committed
    between our read and the takeover (the new worker acts on all of it). Also whether the
    whole history had to be loaded for it (`state` came from a snapshot that lacked it)."""
    if version == state.version:
        return state, False
    missed = await store.read(call_id, from_version=state.version + 1, to_version=version)
    if [r.version for r in missed] != list(range(state.version + 1, version + 1)):
        raise StreamDamaged(f"the takeover went after version {version}, but events "
                            f"{state.version + 1}-{version} are not all there",
                            stream_id=call_id, version=state.version + 1)
    try:
        return fold_into(state, missed), False
    except HistoryNeeded:  # (it was loaded from a snapshot; `state` is half-folded)
        return await load_state(store, call_id, to_version=version, **compaction), True


async def check_tail(store: SqlEventStore, call_id: str, state: SessionState) -> None:
    """Refuse to take a call over when its head row disagrees with the events just read.

    The fold catches gaps and unreadable rows, but not a tail that is simply missing or
    that does not lead to the head: a new worker would then act as if the last events
    never happened (run a finished tool again). One head read and one read of the events
    after `state` (the last one, or those the old worker added since), on attach only. (A
    tail deleted with the head rewritten to match cannot be seen.)
    """
    head = await store.stream_head(call_id)
    if head is None:
        if state.version:
            raise StreamDamaged("it has events but no head row", stream_id=call_id,
                                version=state.version)
        return
    version, last_hash, epoch = head
    if version < state.version:
        raise StreamDamaged(f"the head says version {version} but events go up to "
                            f"{state.version} (written behind the log's back?)",
                            stream_id=call_id, version=version + 1)
    if version == state.version:
        last = await store.read(call_id, from_version=version, to_version=version)
        if not last or last[0].hash != last_hash:
            raise StreamDamaged("the last event's hash does not match the head (events "
                                "deleted from the end and the head moved back?)",
                                stream_id=call_id, version=version)
        if epoch > state.epoch:
            raise StreamDamaged(f"the head's fencing epoch {epoch} is ahead of every "
                                f"worker the log records (epoch {state.epoch})",
                                stream_id=call_id, version=version)
    elif version > state.version:
        # Another worker appended since we read, or the tail is gone: the takeover goes
        # after the head, so the events up to it must be there (one read of the few the
        # old worker added; rows under a head never change).
        tail = await store.read(call_id, from_version=state.version + 1, to_version=version)
        if ([r.version for r in tail] != list(range(state.version + 1, version + 1))
                or tail[-1].hash != last_hash):
            end = tail[-1].version if tail else state.version
            raise StreamDamaged(f"the head says version {version} but the events end at "
                                f"{end} or do not lead to it (events deleted from the "
                                "end?)", stream_id=call_id, version=state.version + 1)
