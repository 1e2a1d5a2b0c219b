"""What the stores of this process tell an observer (metrics: service/metrics.py), if any.

One observer for the whole process, None by default: an append then pays one module
attribute read, nothing more. The observer is called on the event loop's thread and must not
block or raise (an exception in it would fail the append it reports).
"""

from __future__ import annotations

from typing import Protocol


class StoreObserver(Protocol):
    def appended(self, seconds: float, error: BaseException | None) -> None:
        """An append (or takeover) returned after `seconds`, with `error` if it raised."""

    def committed(self, events: int) -> None:
        """One commit (a transaction) stored `events` events, of one append or several."""


#: The process's observer (`observe_commits`), or None.
observer: StoreObserver | None = None


def observe_commits(new: StoreObserver | None) -> StoreObserver | None:
    """Install `new` as the observer of every store of this process (None: none); returns
    the one it replaces."""
    global observer
    old, observer = observer, new
    return old
