"""The stream heads a store committed, kept so a batch can be planned without reading them.

Never trusted alone: a batch planned from the cache writes each head row only where it still
holds the cached (version, hash, epoch), so a stream moved by another store or process is
caught in the same transaction and the batch is planned again from the database.
"""

from __future__ import annotations

from .batch import BatchPlan, _AppendRequest, plan_batch

Head = tuple[int, str, int]  # (version, last hash, epoch)


class HeadCache:
    """stream id -> head as this store last committed or read it under the write lock; the
    most recently written last (a dict's order is the eviction order)."""

    def __init__(self, stats: dict[str, int], max_heads: int):
        self._heads: dict[str, Head] = {}
        self._stats = stats
        self.max_heads = max_heads

    def __len__(self) -> int:
        return len(self._heads)

    def __iter__(self):
        return iter(self._heads)

    def plan(self, batch: list[_AppendRequest]) -> BatchPlan | None:
        """Plan a batch from the cached heads, or None when the database must be asked.

        Only the plain case is planned here: every stream cached, every request at the cached
        version and epoch, no retry of an earlier attempt (whose outcome only the database
        knows), no takeover (it goes wherever the head is, which only the database knows).
        Errors (conflict, fenced) are always reported from heads read under lock.
        The writer then updates each head row only where it still equals `plan.before`; if
        any row moved, it rolls back and plans from the database (`plan.stale`).
        """
        heads = {}
        for r in batch:
            head = self._heads.get(r.stream_id)
            if head is None or r.final_hash is not None or r.claim is not None:
                return None
            heads[r.stream_id] = head
        plan = plan_batch(batch, heads)
        if plan.failed:
            unplan(batch)
            # Read these heads again: the caller may know better than the cache (a database
            # restored to an older state would otherwise keep them on the slow path).
            self.forget(batch)
            return None
        plan.from_cache = True
        return plan

    def remember(self, batch: list[_AppendRequest], plan: BatchPlan) -> None:
        """After a commit: cache the heads read under lock and the heads just written."""
        if plan.from_cache:
            self._stats["cached_plans"] += 1
        else:  # (a plan from the cache started from what is cached already)
            if plan.stale:
                self._stats["stale_heads"] += 1
                self.forget(batch)
            for sid, head in plan.before.items():
                self._put(sid, head)
        for row in (*plan.created, *plan.updated):
            self._put(row[0], (row[1], row[2], row[3]))

    def forget(self, batch: list[_AppendRequest]) -> None:
        for r in batch:
            self._heads.pop(r.stream_id, None)

    def _put(self, sid: str, head: Head) -> None:
        known = self._heads.pop(sid, None)
        if known is not None and known[0] > head[0]:
            head = known  # a later commit of ours (another writer task) got there first
        self._heads[sid] = head  # re-inserted: the dict's order is the eviction order
        if len(self._heads) > self.max_heads:
            del self._heads[next(iter(self._heads))]


def unplan(batch: list[_AppendRequest]) -> None:
    """Forget the final hashes of a plan that was never written (it was rolled back)."""
    for r in batch:
        r.final_hash = None
