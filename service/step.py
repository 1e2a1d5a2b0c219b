"""One step of the service: commit a decision, perform the intents it produced, then do what
else is due, once; the one place a `Fenced` is handled.

Every part that hands the log something goes through `Stepper.step`: a fact noted or
observed (decided on the log), events the service decided itself (a seed's intents and
confirmations), or nothing but the notes (a flush, a round of what is due). The commit is
`CallDriver.observe/record` (write-ahead: the intents of the kinds `intend` names are in
the same append); the effects that commit logged are performed right after it
(`EffectRunner.perform`); then what is due now is performed (`drain`). A newer worker's
fencing epoch, met anywhere in that, ends the step: the service's `on_fenced` is told and
the step returns None. Any other failure is the caller's, which knows what it handed over
and how to keep it (the log writer retries notes; a tool's result is kept for it).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, Protocol

from session_store import events as ev
from session_store.decide import Observation
from session_store.errors import Fenced

from .driver import NOTHING, CallDriver, Decision


class Drain(enum.Enum):
    """When what else is due is performed, after the step's own effects."""

    #: Right after them, before the step returns.
    NOW = "now"
    #: In a task of its own (the receive loop must not wait for it: the audio is behind it).
    LATER = "later"
    #: Not by this step: its caller is the drain, or drains itself.
    NO = "no"


class Performer(Protocol):
    """What a step hands its decision to (service/effects.py)."""

    due_lock: asyncio.Lock

    async def perform(self, decision: Decision, kinds: frozenset[type]) -> bool: ...

    async def perform_due(self, *, after: Decision | None = None) -> None: ...


#: Events the service decided itself, logged as they are.
Events = list[ev.Event] | tuple[ev.Event, ...]
Spawn = Callable[[Coroutine[Any, Any, Any], str], asyncio.Task]


class Stepper:
    """Commits, performs and drains, for one service (composed into it, made first)."""

    def __init__(self, driver: CallDriver, spawn: Spawn,
                 on_fenced: Callable[[], Awaitable[None]]):
        self._driver = driver
        self._spawn = spawn
        self._on_fenced = on_fenced
        self.effects: Performer | None = None  # set once the effect runner exists

    async def step(self, what: Observation | Events | None = None, *,
                   intend: frozenset[type] = NOTHING, drain: Drain = Drain.NOW,
                   hold_effects: bool = False, timeout: float | None = None
                   ) -> Decision | None:
        """Commit `what` (an observation, decided on the log; events, as they are; None:
        only what was noted) with the intents of the effects of kinds `intend` now due,
        perform those, then drain as `drain` says. `hold_effects`: commit and perform under
        the effects' lock (no other task may decide to send the same results meanwhile).
        `timeout`: how long the store may wait for a database that is down. The decision,
        with `acted` set; None if a newer worker fenced this one out (handled here)."""
        effects = self._effects
        lock: AbstractAsyncContextManager[Any] = (effects.due_lock if hold_effects
                                                  else nullcontext())
        try:
            async with lock:
                if isinstance(what, (list, tuple)):
                    decision = await self._driver.record(*what, intend=intend)
                else:
                    decision = await self._driver.observe(what, intend=intend, timeout=timeout)
                if intend:
                    decision.acted = await effects.perform(decision, intend)
            # (Its first round takes the commit's own `due` if nothing was committed since.)
            if drain is Drain.NOW:
                await effects.perform_due(after=decision)
            elif drain is Drain.LATER:
                self._spawn(effects.perform_due(after=decision), "perform_due")
        except Fenced:
            await self._on_fenced()
            return None
        return decision

    @property
    def _effects(self) -> Performer:
        assert self.effects is not None
        return self.effects
