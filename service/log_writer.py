"""The service's one way to say "log this": `LogWriter.log(*items, when=...)`.

Every fact the service observes, and every event it decides, reaches the call's log through
here, in the order it was handed over: the driver decides noted observations in that order at
the next commit, so nothing is ever decided ahead of a fact noted before it. `When` says how
long the caller may wait for the log, which is what differs between the receive loop (the
audio is behind it), a tool's result (the model waits for it) and a session's start (its
messages must not be read before it is logged). A log that refuses an append never loses a
fact: it stays noted, and the writer's task retries it with backoff until the log takes it.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from loguru import logger

from session_store import SessionState
from session_store import events as ev
from session_store.delivery import StartCall, waits_for_idle, waits_for_silence
from session_store.errors import StoreUnavailable

from .driver import NOTHING, CallDriver, Decision
from .step import Drain, Spawn, Stepper

# Backoff of the task that logs noted facts while the log is unavailable (each try itself
# waits up to the store's append_timeout).
NOTES_RETRY_FIRST_S, NOTES_RETRY_MAX_S = 0.25, 2.0
# How long a database that refuses appends may hold the receive loop for a fact logged there
# (When.HERE), counted as the store's append deadline (checked when an attempt fails): then
# the task retries it, and the audio behind it flows.
LOG_NOW_TIMEOUT_S = 0.2
# How long a lazy fact (one that decides nothing now: speech started, a resumption handle, a
# send confirmed, a stop nothing waits for) may wait, on a store that commits urgent appends
# inline, to share the next commit before the task logs it on its own
# (bench/turn_overhead.py: committed at once, such a fact occupied the log when the next
# toolCall came, and that toolCall waited for it). Decisions never lag: every commit stages
# the notes before anything it decides.
LAZY_NOTE_WAIT_S = 0.05
# At the end of the call, how long lazy facts left over may take to be logged.
CLEANUP_NOTES_WAIT_S = 2.0
#: What a commit of facts decides at once: the calls they let start (run right after it).
STARTS = frozenset({StartCall})


class When(enum.Enum):
    """How long the caller waits for the log to take what it hands over."""

    #: Not at all, and the fact decides nothing by itself: it may wait LAZY_NOTE_WAIT_S to
    #: share another commit (only where the store says that pays: `lazy_facts`).
    LAZY = "lazy"
    #: Not at all: the writer's task appends it at once.
    SOON = "soon"
    #: Appended right here with the calls it lets start, which then run (what stock pipecat
    #: does with a toolCall in the receive loop), but only when nothing else holds the log
    #: and only for LOG_NOW_TIMEOUT_S of a database that refuses it: then the task takes over.
    HERE = "here"
    #: Appended here (a decision it leads to must follow it); a refusal is reported, never
    #: raised: the fact stays noted and the task retries it.
    KEPT = "kept"
    #: As KEPT, then the calls it lets start run and what is due now is done: one
    #: observation, one decision, its effects.
    ACTED_ON = "acted_on"
    #: Until the log has it, however long the database is down (a session's start before its
    #: messages, its end before the next one): False only if fenced or the call is ending.
    DURABLE = "durable"


class Effects(Protocol):
    """What the writer's task drains (service/effects.py)."""

    async def perform_due(self, *, after: Decision | None = None) -> None: ...


class LogWriter:
    """Hands facts to the call's driver in order and keeps them until the log takes them."""

    def __init__(self, driver: CallDriver, stepper: Stepper, spawn: Spawn, *, label: str):
        self._driver = driver
        self._step = stepper.step
        self._spawn = spawn
        self.label = label  # who speaks in the log lines (the service and its call)
        self.effects: Effects | None = None  # set once the effect runner exists
        self._task: asyncio.Task | None = None
        self._due = asyncio.Event()  # a fact that must not wait is noted
        self._waiting = False  # the task waits for another append to take lazy facts along
        self._effects_failed = False  # an effect's append failed: the task retries it
        #: stop() or cleanup() began: an outage is no longer waited out (When.DURABLE).
        self.call_ending = False
        driver.on_commit = self._after_commit

    @property
    def pending(self) -> bool:
        """Facts are noted that the log has not taken yet."""
        return self._driver.has_notes

    async def log(self, *items: Any, when: When = When.SOON) -> bool:
        """Log observations (decided on the state as it is when logged) or events, in the
        order handed over, as `when` says. True if they were appended before this returned."""
        if when is When.DURABLE:
            return await self._until_logged(items)
        for item in items:
            self._driver.note(item)
        if when in (When.LAZY, When.SOON):
            # Lazy only where the store says it pays (SQLite's writer process): a toolCall
            # committed at once amid its audio otherwise waited behind the confirmation.
            self._wake(lazy=when is When.LAZY and self._driver.store.lazy_facts)
            return False
        if when is When.HERE:
            return await self._here()
        return await self._flush_kept(items, acted_on=when is When.ACTED_ON)

    def along(self, *items: Any) -> None:
        """Note facts that decide nothing now and that a commit nearly always follows at
        once (the handles' gate, service/handle_gate.py: noted just before a send whose
        confirmation is logged, or with the model's output): they ride that commit, on any
        store, and are logged on their own only if none comes within LAZY_NOTE_WAIT_S (a
        note left for ever would hold off whoever waits for the log to settle)."""
        for item in items:
            self._driver.note(item)
        self._wake(lazy=True)

    def retry_effects(self) -> None:
        """An effect's own append failed: the task re-reads the log and performs what is due
        again, with backoff, until the log takes it (waiting for the next observation could
        mean waiting for ever: a deferred call whose start was refused, the bot silent)."""
        self._effects_failed = True
        self._wake()

    async def drain(self, cancel: Callable[[asyncio.Task], Awaitable[None]]) -> None:
        """At the end of the call: log the lazy facts left over (the transport's last stop,
        a confirmation), which no commit will take along now; an outage is not waited out."""
        if self._task and self._waiting:
            self._due.set()
            await asyncio.wait({self._task}, timeout=CLEANUP_NOTES_WAIT_S)
        if self._task and not self._task.done() and self._driver.has_notes:
            # What is left is the task waiting out an outage past the end of the call.
            logger.error(f"{self.label} ended with {self._driver.pending_notes} noted "
                         "fact(s) the log never took")
            await cancel(self._task)

    # ------------------------------------------------------------------ the modes
    async def _flush_kept(self, items: tuple, *, acted_on: bool) -> bool:
        """Logged (and, `acted_on`, the calls it lets start run and what is due is done)?
        False if kept, or fenced. An observation handed to the append itself was lost with
        its exception (a prompt change made during an outage never reconnected:
        tests/faults/test_effect_retry.py)."""
        try:
            decision = await self._step(intend=STARTS if acted_on else NOTHING,
                                        drain=Drain.NOW if acted_on else Drain.NO)
        except Exception as exc:  # noqa: BLE001 - kept in the notes: the task retries
            logger.error(f"{self.label}: the log did not take {items!r}; kept and retried: "
                         f"{type(exc).__name__}: {exc}")
            self._wake()
            return False
        return decision is not None

    async def _here(self) -> bool:
        """Through the task, a toolCall waited for the loop to get round to it, behind the
        audio that came with it (0.5–1 ms per call: bench/turn_overhead.py)."""
        if self._driver.busy or self._driver.stale:
            # Stale: an append failed, and the state must be read again first, a read the
            # database may not answer for a while (read_timeout). Not in the receive loop.
            self._wake()
            return False
        try:
            # Anything else now due (a result waiting for this session, ...) is not the
            # receive loop's business: it may wait for the log (Drain.LATER).
            decision = await self._step(intend=STARTS, drain=Drain.LATER,
                                        timeout=LOG_NOW_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the notes are kept: the task retries
            logger.warning(f"{self.label}: logging in the receive loop failed "
                           f"({type(exc).__name__}: {exc}); the notes task retries")
            self._wake()
            return False
        return decision is not None

    async def _until_logged(self, events: tuple) -> bool:
        """A reconnect during an outage used to fail at its first append and leave the call
        without a session: this waits, with the notes' backoff."""
        delay = NOTES_RETRY_FIRST_S
        while True:
            try:
                # An observation is decided on the log, as it goes in.
                one = len(events) == 1 and not isinstance(events[0], ev.Event)
                decision = await self._step(events[0] if one else events, drain=Drain.NO)
                return decision is not None
            except StoreUnavailable as exc:
                if self.call_ending:
                    logger.error(f"{self.label}: ending with {events!r} not logged: {exc}")
                    return False
                logger.error(f"{self.label}: the log did not take {events!r}, retrying in "
                             f"{delay:.2f}s: {exc}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, NOTES_RETRY_MAX_S)

    # ------------------------------------------------------------------ the task
    def _wake(self, *, lazy: bool = False) -> None:
        if not lazy:
            self._due.set()
        if self._task is None or self._task.done():
            self._task = self._spawn(self._run(), "log_notes")

    def _after_commit(self, state: SessionState) -> None:
        """The driver committed: lazy facts still noted must go now if something waits for
        the bot's silence (a call deferred by this very commit, with a stop noted lazily
        while it was under way, must not wait LAZY_NOTE_WAIT_S for it)."""
        if self._driver.has_notes and (waits_for_silence(state) or waits_for_idle(state)):
            self._wake()

    async def _run(self) -> None:
        delay = NOTES_RETRY_FIRST_S
        if not self._due.is_set():  # only lazy facts: give an append time to take them
            self._waiting = True
            # (asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel that arrives in
            # the loop turn the event is set, and the task would go on after its owner stopped)
            try:
                async with asyncio.timeout(LAZY_NOTE_WAIT_S):
                    await self._due.wait()
            except TimeoutError:
                pass
            finally:
                self._waiting = False
        try:
            # Until no fact is left: one noted while this task performs what is due would
            # find it still running, start no task of its own, and wait for the next append
            # (seen: a toolCall that arrived while the previous result was being sent stayed
            # unlogged, and unanswered, while the server waited for it). Also while the state
            # is stale: an effect's own append failed, and nothing is due until the log is
            # re-read (`retry_effects`).
            while self._driver.has_notes or self._driver.stale:
                decision: Decision | None = None
                while self._driver.has_notes or self._driver.stale:
                    self._due.clear()  # this flush takes whatever is noted now
                    try:
                        decision = await self._step(intend=STARTS, drain=Drain.NO)
                    except Exception as exc:  # noqa: BLE001 - the log is down: keep, retry
                        # What was noted stays queued and is tried again until the log takes
                        # it: a tool call among the notes must not be left unlogged, unrun
                        # and unanswered for good (seen: a 9 s PostgreSQL outage left the
                        # model waiting for ever when nothing else came to flush).
                        if self._driver.state.closed or self._driver.fenced:
                            raise
                        logger.error(f"{self.label}: the log did not take "
                                     f"{self._driver.pending_notes} noted fact(s), retrying "
                                     f"in {delay:.1f}s: {type(exc).__name__}: {exc}")
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, NOTES_RETRY_MAX_S)
                        continue
                    if decision is None:
                        return  # fenced (the step told the service)
                    delay = NOTES_RETRY_FIRST_S
                self._effects_failed = False
                assert self.effects is not None
                await self.effects.perform_due(after=decision)
                if self._effects_failed:  # the log took the re-read, not the effect: wait
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, NOTES_RETRY_MAX_S)
        except Exception as exc:  # noqa: BLE001 - a task: report, the next append retries
            logger.exception(f"{self.label}: could not log {exc}")
