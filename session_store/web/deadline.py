"""An answer in time during a database outage: a page that has not answered after a few
seconds asks whether the database answers at all; if not, it is abandoned and the viewer says
so (503) instead of hanging on a read until the read timeout and answering a bare 500."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from sqlalchemy.exc import TimeoutError as PoolTimeout

from ..errors import StoreUnavailable

T = TypeVar("T")

#: A page still working after this long asks whether the database answers ...
PATIENCE_S = 3.0
#: ... and gives a new connection this long to answer: a 503 within 5 s of the request.
PROBE_S = 1.5


async def within_outage_deadline(work: Awaitable[T], store) -> T:
    """`work`'s result; StoreUnavailable (with the reason) if it is still running after
    PATIENCE_S and the database does not answer a new connection in PROBE_S. A slow page
    on a database that answers is waited for."""
    task = asyncio.ensure_future(work)
    probe = None
    try:
        done, _ = await asyncio.wait({task}, timeout=PATIENCE_S)
        if not done:
            probe = asyncio.ensure_future(store.unreachable(PROBE_S))
            await asyncio.wait({task, probe}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and probe.result() is not None:
                raise StoreUnavailable(f"the database does not answer ({probe.result()})")
            await asyncio.wait({task})  # (a slow page on a database that answers)
        return _result(task, store)
    finally:
        # Abandoned (an outage, or the client went away): stuck on a connection that may
        # never answer, so not waited for.
        for pending in (task, probe):
            if pending is not None and not pending.done():
                pending.cancel()
                pending.add_done_callback(lambda t: t.cancelled() or t.exception())


def _result(task: asyncio.Future, store):
    """The task's result; a driver's outage error that a query outside the store's own
    reads let through (the audit queries' own SQL) as StoreUnavailable, as the store says it;
    a pool with no connection free for its timeout, too (the database is too busy for us)."""
    try:
        return task.result()
    except PoolTimeout as exc:
        raise StoreUnavailable("every connection of the viewer to the database is busy "
                               "(its pool is full): try again") from exc
    except Exception as exc:
        outage = store.outage_of(exc)
        if outage is None:
            raise
        raise outage from exc
