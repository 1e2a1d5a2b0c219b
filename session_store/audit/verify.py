"""Verify the log: recompute each stream's hash chain, decode and fold its events, and say
where it first breaks.

Above storage: it reads the chains through the store's read API (`read_chains`) and checks
them with the pure core (records, projection); `verify_stream` is pure, no I/O.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..errors import EventDecodeError, StreamDamaged
from ..projection import fold_into
from ..records import GENESIS_HASH, RecordedEvent, chain_hash
from ..state import TAKEN_OVER, SessionState


@dataclass(frozen=True)
class StreamReport:
    stream_id: str
    ok: bool
    events_checked: int
    first_bad_version: int | None = None
    first_bad_position: int | None = None
    reason: str = ""

    def to_json(self) -> dict:
        return {"stream_id": self.stream_id, "ok": self.ok, "events_checked": self.events_checked,
                "first_bad_version": self.first_bad_version,
                "first_bad_position": self.first_bad_position, "reason": self.reason}


def verify_stream(stream_id: str, rows: list[RecordedEvent],
                  head: tuple[int, str, int] | None) -> StreamReport:
    """`rows` in version order; `head` is the stream row's (version, last_hash, epoch), if any.

    Catches an edited row (hash mismatch), a deleted row (version gap, or a head ahead of the
    last row), reordered rows (versions swapped: the chain breaks; positions out of order),
    an inserted or truncated tail (head disagrees with the last row), a call's head whose
    fencing epoch is above every one its log records (a takeover refuses such a call), and
    an intact row this code cannot decode (unknown type, newer schema, corrupt payload) or
    fold (it names a tool call never requested). A tail truncated with the head row
    rewritten to match (version and hash) cannot be told from a shorter call: that needs a
    head kept outside the database.
    """
    prev_hash, prev_position = GENESIS_HASH, None
    state = SessionState(stream_id=stream_id)

    def bad(ev: RecordedEvent | None, version: int, reason: str, checked: int) -> StreamReport:
        return StreamReport(stream_id, False, checked, version,
                            ev.position if ev else None, reason)

    for i, ev in enumerate(rows, start=1):
        if ev.version != i:
            return bad(ev, i, f"version {i} is missing (next row is version {ev.version})", i - 1)
        if prev_position is not None and ev.position <= prev_position:
            return bad(ev, i, "rows are out of order: position goes backwards", i - 1)
        expected = chain_hash(prev_hash, stream_id, ev.version, ev.type, ev.schema_version,
                              ev.recorded_at_us, ev.data_json)
        if expected != ev.hash:
            return bad(ev, i, "hash mismatch: the row was altered, or the one before it", i - 1)
        try:
            ev.recorded_at  # noqa: B018 - (checks it is a time a date can show)
            fold_into(state, [ev])  # decodes (and checks) the payload, then applies it
        except EventDecodeError as exc:
            # Intact, but this code cannot read it (or it makes no sense where it stands):
            # every reader of the call refuses it, so "ok" would be the wrong answer to
            # "is this call's log sound?".
            return bad(ev, i, f"the event cannot be read by this code: {exc}", i - 1)
        prev_hash, prev_position = ev.hash, ev.position
    if head is None:
        if rows:
            return bad(None, len(rows), "the stream has events but no head row", len(rows))
        return StreamReport(stream_id, True, 0)
    head_version, head_hash, head_epoch = head
    if head_version != len(rows):
        return bad(None, len(rows) + 1 if head_version > len(rows) else head_version + 1,
                   f"the head says version {head_version} but {len(rows)} events are stored "
                   "(events deleted from the end, or added behind the log's back)", len(rows))
    if head_hash != prev_hash:
        return bad(rows[-1] if rows else None, len(rows),
                   "the last event's hash does not match the head", len(rows))
    # A call's epochs are in its events (session opened, worker attached: hashed). One above
    # them all came from no append of a worker (a takeover refuses such a call). One below
    # re-admits the workers the takeovers fenced; 0 is a call whose appends passed no epoch
    # (the store's own users may), unless the log records a takeover, which raised it. A
    # stream that records no epoch (not a call) has only the appends' word for it.
    if (state.opened or state.epoch) and head_epoch > state.epoch:
        return bad(rows[-1] if rows else None, len(rows),
                   f"the head says fencing epoch {head_epoch} but the log records epoch "
                   f"{state.epoch} (the head row was changed behind the log's back)", len(rows))
    if head_epoch < state.epoch and (head_epoch > 0 or state.epoch >= TAKEN_OVER):
        return bad(rows[-1] if rows else None, len(rows),
                   f"the head says fencing epoch {head_epoch} but the log records epoch "
                   f"{state.epoch}: a lowered epoch lets a fenced worker append again (the "
                   "head row was changed behind the log's back)", len(rows))
    return StreamReport(stream_id, True, len(rows))


async def verify_log(store, stream_id: str | None = None) -> list[StreamReport]:
    """One report per stream of `store` (a `SqlEventStore`), or for `stream_id` alone: the
    first bad event of each, if any."""
    reports = []
    async with contextlib.aclosing(store.read_chains(stream_id)) as chains:
        async for sid, rows, head in chains:
            if isinstance(rows, StreamDamaged):  # (the database could not read them)
                reports.append(StreamReport(sid, False, 0, None, None, str(rows)))
            else:
                reports.append(verify_stream(sid, rows, head))
    return reports
