"""What one server records across its connections, and how tests wait on it.

The reader (:mod:`.intake`) and every connection's sender (:mod:`.session`) write here;
the server (:mod:`.server`) owns it and shows it to tests. Kept apart from the server so
the sending side needs nothing of the server that started it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from .record import HandleRecord


class ServerRecord:
    """Violations, server errors, issued handles and named signals, with change notices."""

    def __init__(self) -> None:
        self.violations: list[dict[str, Any]] = []
        self.handles: dict[str, HandleRecord] = {}
        self.errors: list[str] = []
        self._signals: dict[str, asyncio.Event] = {}
        self._changed = asyncio.Event()
        self._handle_count = 0

    def add_violation(self, kind: str, connection: int, call_id: str | None, detail: str) -> None:
        self.violations.append(
            {"kind": kind, "connection": connection, "id": call_id, "detail": detail, "at": time.time()}
        )
        self.notify()

    def new_handle_name(self, connection: int) -> str:
        self._handle_count += 1
        return f"handle-{connection}-{self._handle_count}"

    def signal_event(self, name: str) -> asyncio.Event:
        return self._signals.setdefault(name, asyncio.Event())

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Return once ``condition()`` holds; it is re-checked after every change notice."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {timeout}s")
            changed = self._changed
            try:  # (asyncio.timeout: wait_for on 3.11 can lose a cancel that meets a notice)
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                pass

    def notify(self) -> None:
        """Wake everything waiting in :meth:`wait_until`."""
        self._changed.set()
        self._changed = asyncio.Event()
