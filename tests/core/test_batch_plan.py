"""The batch planner's recognition of commits whose answer was lost (pure, no database).

A retried batch plans again from the heads read under lock. Whatever an earlier try
committed must get its version back (not a ConcurrencyConflict, and not be written again);
the head proves the last request of a stream, and the hash chain the requests chained before
it in the same batch. The end-to-end case (PostgreSQL, a partition that eats the answer of a
batch of two appends to one stream) is in tests/faults/test_network_partition.py.
"""

from __future__ import annotations

from session_store.errors import ConcurrencyConflict
from session_store.events import canonical_json
from session_store.storage.batch import _AppendRequest, plan_batch, stored_hashes_wanted

from .helpers import T0_US, msg


def _request(stream: str, expected: int, *texts: int) -> _AppendRequest:
    rows = [(e.TYPE, e.SCHEMA, canonical_json(e.to_data())) for e in map(msg, texts)]
    return _AppendRequest(stream, rows, expected, None, T0_US + expected, deadline=0.0)


HEADS = {"s": (3, "h3", 0), "t": (1, "t1", 0)}


def _committed(batch: list[_AppendRequest]) -> dict:
    """Plan the batch on HEADS (as the first try did) and return the heads it leaves."""
    heads = dict(HEADS)
    first = plan_batch(batch, heads)
    assert first.outcomes == [r.expected_version + len(r.rows) for r in batch]
    return heads


def test_a_chain_of_two_appends_to_one_stream_is_recognised_whole():
    batch = [_request("s", 3, 11), _request("s", 4, 12, 13), _request("t", 1, 21)]
    after = _committed(batch)
    retry = plan_batch(batch, dict(after))
    assert retry.outcomes == [4, 6, 2]  # (before the fix: a conflict for the first)
    assert retry.events == [] and retry.updated == [] and retry.created == []


def test_only_what_the_earlier_try_wrote_is_recognised():
    batch = [_request("s", 3, 11), _request("s", 4, 12)]
    _committed(batch)
    # Suppose only the first had been committed (its own earlier try): it is recognised by
    # the head, and the second is planned on it and written now.
    head_after_first = (4, batch[0].final_hash, 0)
    retry = plan_batch(batch, {"s": head_after_first})
    assert retry.outcomes == [4, 5]
    assert [e[1] for e in retry.events] == [5]


def test_a_request_whose_hash_does_not_lead_to_the_stored_one_is_a_conflict():
    batch = [_request("s", 3, 11), _request("s", 4, 12)]
    after = _committed(batch)
    batch[0].final_hash = "not what the second was planned on"
    retry = plan_batch(batch, dict(after))
    assert isinstance(retry.outcomes[0], ConcurrencyConflict)
    assert retry.outcomes[1] == 5


def test_nothing_stored_plans_everything_again():
    batch = [_request("s", 3, 11), _request("s", 4, 12)]
    _committed(batch)
    retry = plan_batch(batch, dict(HEADS))  # the earlier try was rolled back
    assert retry.outcomes == [4, 5]
    assert [e[1] for e in retry.events] == [4, 5]


def test_a_commit_another_writer_appended_behind_is_recognised_by_its_stored_hash():
    batch = [_request("s", 3, 11), _request("t", 1, 21)]
    after = _committed(batch)
    assert stored_hashes_wanted(batch) == [("s", 4), ("t", 2)]
    # Before the retry, another writer appended to s behind our commit: the head moved on.
    moved = {**after, "s": (5, "another writer's hash", 0)}
    stored = {("s", 4): batch[0].final_hash, ("t", 2): batch[1].final_hash}
    retry = plan_batch(batch, dict(moved), stored)
    assert retry.outcomes == [4, 2]  # (before the fix: a conflict for s)
    assert retry.events == []
    # Another writer's event at that version (ours never landed) is a conflict, as it was.
    retry = plan_batch(batch, dict(moved), {("s", 4): "another writer's event"})
    assert isinstance(retry.outcomes[0], ConcurrencyConflict) and retry.outcomes[1] == 2
