"""The service's handle on its call's log: observe → decide → append → fold; what is due.

This is the imperative shell's only path to the log, and it has no pipecat in it. Live
operation and takeover after a crash use it the same way: `attach()` loads the state (and, for
an existing call, records the new worker with a higher fencing epoch), then every observation
goes through `observe()` and every effect's outcome through `record()`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import reprlib
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from session_store import Policy, SessionState, choose_resumption, decide, due, load_state
from session_store import events as ev
from session_store.checks import check_count
from session_store.decide import Effect, Observation
from session_store.errors import CallClosed, ConcurrencyConflict, Fenced, StreamDamaged
from session_store.events import canonical_json
from session_store.loading import snapshot_of
from session_store.projection import HistoryNeeded, fold_into
from session_store.records import RecordedEvent
from session_store.schema import STREAM_ID_MAX, valid_id
from session_store.storage import Snapshot, SqlEventStore

log = logging.getLogger(__name__)

#: Rounds of read-and-append an attach makes while other workers keep moving the stream.
ATTACH_TRIES = 8

#: Events the service acts on the moment their commit returns (run a tool, send a result):
#: their appends are `urgent` (SQLite may commit them on the loop's thread, no hand-off).
_ACTED_ON = (ev.ToolCallStarted, ev.ToolResultSending)

#: Decides more events on the state after a record's own (same append, same commit).
Then = Callable[[SessionState], list[ev.Event]]


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def now_us() -> int:
    return time.time_ns() // 1000


def storable(events: list[ev.Event], generation: int) -> list[ev.Event]:
    """What a fact from the wire decided, or one anomaly instead if any of it cannot be stored
    (NaN, a lone surrogate in a transcript or handle: the SDK lets both through, the log's
    canonical JSON refuses them). Without this, such a fact would fail its append, be noted
    again, and fail every append after it: one hostile frame would stop the call's log."""
    for e in events:
        problem = why_unstorable(e)
        if problem is not None:
            return [unstorable_anomaly(e.TYPE, e.to_data(), problem, generation)]
    return events


def why_unstorable(e: ev.Event) -> str | None:
    """Why the log cannot store this event (NaN, a lone surrogate, nesting too deep), or None."""
    try:
        canonical_json(e.to_data()).encode()
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        return str(exc)[:200]
    return None


def unstorable_anomaly(event_type: str, data: Any, problem: str,
                       generation: int) -> ev.AnomalyRecorded:
    """The anomaly logged in place of what the log cannot store: its type, the problem and
    the start of the value (masked whole by --redact: it may hold anything)."""
    try:
        preview = json.dumps(data, ensure_ascii=True, default=repr)
    except (ValueError, RecursionError):  # a cycle, or nested past Python's own limit
        preview = reprlib.repr(data)
    return ev.AnomalyRecorded("unstorable_event", {
        "type": event_type, "error": problem,
        "preview": preview[:200] + (f"… ({len(preview)} chars)" if len(preview) > 200 else "")},
        generation)


class CallDriver:
    """Owns the in-memory state of one call and keeps it equal to the fold of the log.

    Every `snapshot_every` events it saves a snapshot (compacted: bounded however long the
    call) in the background, so a takeover of a long call loads in constant time. A state
    loaded from a snapshot is the decision state; `ensure_history()` loads the rest when it is
    needed (seeding a fresh session), and a fold that needs it reloads the whole log."""

    def __init__(self, store: SqlEventStore, call_id: str, policy: Policy | None = None,
                 worker_id: str | None = None, snapshot_every: int = 500):
        # Refused here, at construction, rather than by the first append (at the pipeline's
        # start, reported as a connection error) or never (a policy of another type).
        if not isinstance(store, SqlEventStore):
            hint = (" (await session_store.open_store(url) first)"
                    if asyncio.iscoroutine(store) else "")
            raise TypeError(f"store must be an open session store{hint}, not "
                            f"{type(store).__name__}")
        if not isinstance(call_id, str) or not call_id or not valid_id(call_id):
            raise ValueError(f"call_id must be text of 1 to {STREAM_ID_MAX} characters "
                             f"without NUL, valid UTF-8, not {call_id!r:.80}")
        if policy is not None and not isinstance(policy, Policy):
            raise TypeError(f"policy must be a session_store.Policy, not "
                            f"{type(policy).__name__}")
        check_count("snapshot_every", snapshot_every)
        self.store, self.call_id = store, call_id
        self.policy = policy or Policy()
        # How far back this policy's decisions look: what snapshots keep and must have kept.
        self._compaction = {"handle_ttl_us": self.policy.handle_ttl_us,
                            "crossing_window_us": int(self.policy.crossing_window_s * 1e6)}
        self.worker_id = worker_id or default_worker_id()
        self.state = SessionState(stream_id=call_id)
        self.epoch = 0
        self.fenced = False
        self._lock = asyncio.Lock()
        self._notes: deque[Observation | ev.Event | Then] = deque()
        # Called with the state after each commit (the service wakes lazy notes with it).
        self.on_commit: Callable[[SessionState], None] | None = None
        self._stale = False  # a failed append left the state unsure: re-read before use
        # (version before, rows, how many noted items) of an append whose outcome is unknown
        # (it failed or its caller was cancelled, possibly after the commit).
        self._unsure: tuple[int, list[tuple[str, str]], int] | None = None
        self._full_history = False  # reload from the whole log, not a snapshot
        self.snapshot_every = snapshot_every
        self._snapshot_version = 0
        self._snapshot_task: asyncio.Task | None = None

    async def attach(self, *, model: str, tools: list[str], settings: dict) -> SessionState:
        """Open the call, or take it over: a new fencing epoch shuts the old worker out (I6)."""
        async with self._lock:
            conflict: ConcurrencyConflict | None = None
            for _ in range(ATTACH_TRIES):
                # Loaded aside and published only once this worker owns the call: a reader
                # of `state` (the app, the crash harness's control loop) must never see the
                # dead worker's last state — "connected, all delivered" — as this worker's
                # (seen: a takeover ended the call before it ever reconnected).
                state = await load_state(self.store, self.call_id, **self._compaction)
                if state.closed:
                    # Nobody is on an ended call: taking it over would append after its end
                    # and open a Gemini session for no one.
                    raise CallClosed(self.call_id, state.version)
                if conflict is not None and conflict.actual is not None \
                        and state.version < conflict.actual:
                    # Read after the append that told us the head is at `actual`: fewer
                    # events than that means rows under the head are gone.
                    raise StreamDamaged(
                        f"the head is at version {conflict.actual} but the events end at "
                        f"{state.version} (events deleted from the end?); not taking the "
                        "call over from a partial log", stream_id=self.call_id,
                        version=state.version + 1)
                await self._check_tail(state)
                epoch = state.epoch + 1
                first = (ev.SessionOpened(model, tools, self.worker_id, epoch, settings)
                         if not state.opened
                         else ev.WorkerAttached(self.worker_id, epoch, "takeover"))
                at = now_us()
                try:
                    await self.store.append(self.call_id, [first], state.version, epoch=epoch,
                                            recorded_at_us=at)
                except ConcurrencyConflict as exc:
                    # Another worker moved the stream (Fenced: two or more attached since we
                    # read, so our epoch is already too old): read again and retry.
                    conflict = exc
                    await asyncio.sleep(random.uniform(0, 0.02))  # de-synchronise racers
                    continue
                self.state = state
                self._stage([first], at)
                self.epoch = epoch
                return self.state
            raise ConcurrencyConflict(
                self.call_id, state.version, conflict.actual) from conflict

    async def _check_tail(self, state: SessionState) -> None:
        """Refuse to take a call over when its head row disagrees with the events just read.

        The fold catches gaps and unreadable rows, but not a tail that is simply missing or
        that does not lead to the head: a new worker would then act as if the last events
        never happened (run a finished tool again). One head read and at most one event read,
        on attach only. (A tail deleted with the head rewritten to match cannot be seen.)
        """
        head = await self.store.stream_head(self.call_id)
        if head is None:
            if state.version:
                raise StreamDamaged("it has events but no head row", stream_id=self.call_id,
                                    version=state.version)
            return
        version, last_hash, epoch = head
        if version < state.version:
            raise StreamDamaged(f"the head says version {version} but events go up to "
                                f"{state.version} (written behind the log's back?)",
                                stream_id=self.call_id, version=version + 1)
        if version == state.version:
            last = await self.store.read(self.call_id, from_version=version, to_version=version)
            if not last or last[0].hash != last_hash:
                raise StreamDamaged("the last event's hash does not match the head (events "
                                    "deleted from the end and the head moved back?)",
                                    stream_id=self.call_id, version=version)
            if epoch > state.epoch:
                raise StreamDamaged(f"the head's fencing epoch {epoch} is ahead of every "
                                    f"worker the log records (epoch {state.epoch})",
                                    stream_id=self.call_id, version=version)
        # version > state.version: another worker appended since we read (or the tail is
        # gone); the append below conflicts and the next round tells which.

    async def record(self, *events: ev.Event, then: Then | None = None) -> list[ev.Event]:
        """Append events (write-ahead) and fold them into the state.

        `then(state)`, called on the state with `events` folded in, may return more events
        decided on it (e.g. "started" for the calls now due): they go into the same append,
        one commit instead of two on the path of a tool call. Returns all appended events
        of this call (noted ones excluded)."""
        async with self._lock:
            return await self._commit(list(events), then)

    async def observe(self, obs: Observation, then: Then | None = None) -> list[ev.Event]:
        """Record an observation and what was decided about it; returns the events."""
        async with self._lock:
            return await self._commit(obs, then)

    def note(self, item: Observation | ev.Event | Then) -> None:
        """Queue a fact that must be logged in order but need not hold up the caller (a
        resumption handle, speech starting on the audio path): it is decided and appended
        with the next record/observe/flush, ahead of their events, in the order noted. A
        `Then` is called on the state as it is when logged and returns the events (e.g. a
        tool result whose own append failed: logged unless that append committed after
        all, which the state re-read from the log shows)."""
        self._notes.append(item)

    @property
    def has_notes(self) -> bool:
        return bool(self._notes)

    @property
    def pending_notes(self) -> int:
        return len(self._notes)

    async def flush(self, then: Then | None = None, *, timeout: float | None = None
                    ) -> list[ev.Event]:
        """Append whatever was noted (and what `then` decides on the state after it).
        `timeout`: how long the store may wait for a database that is down (its default
        otherwise); the notes stay queued if it gives up."""
        async with self._lock:
            return await self._commit([], then, timeout)

    @property
    def stale(self) -> bool:
        """A failed append left the state unsure: nothing is due until the next record,
        observe or flush re-reads the log."""
        return self._stale

    @property
    def busy(self) -> bool:
        """A record, observation or flush holds the log (a new one would wait for it)."""
        return self._lock.locked()

    async def ensure_history(self) -> None:
        """Make sure the state holds the whole conversation (it may come from a snapshot)."""
        if not self.state.history_complete:
            async with self._lock:
                self._full_history = True
                await self._reload()

    async def _commit(self, what: list[ev.Event] | Observation, then: Then | None,
                      timeout: float | None = None) -> list[ev.Event]:
        try:
            mine = await self._commit_once(what, then, timeout)
        except HistoryNeeded:
            # Staging needed what the snapshot left out (a fresh session, an archived call):
            # nothing was appended; decide again on the whole history.
            self._full_history = True
            await self._reload()
            mine = await self._commit_once(what, then, timeout)
        self._maybe_snapshot()
        return mine

    def _maybe_snapshot(self) -> None:
        """Right after a commit, under the lock: the state is exactly the fold of the log
        (later, another commit may have staged events it has not appended yet)."""
        if (self.snapshot_every and not self.fenced and not self._stale
                and self.state.version - self._snapshot_version >= self.snapshot_every
                and (self._snapshot_task is None or self._snapshot_task.done())):
            self._snapshot_version = self.state.version
            snapshot = snapshot_of(self.state, **self._compaction)
            self._snapshot_task = asyncio.ensure_future(self._save_snapshot(snapshot))

    async def _save_snapshot(self, snapshot: Snapshot) -> None:
        try:
            await self.store.save_snapshot(snapshot)
        except Exception as exc:  # noqa: BLE001 - a cache: the log is the truth
            log.warning("snapshot of %s at v%s failed: %s", self.call_id, snapshot.version, exc)

    async def _commit_once(self, what: list[ev.Event] | Observation, then: Then | None,
                           timeout: float | None = None) -> list[ev.Event]:
        if self.fenced:
            raise Fenced(self.call_id, self.epoch, self.state.epoch)
        if self._stale:
            await self._reload()
            if self.epoch and self.state.epoch > self.epoch:
                # The log now belongs to a newer worker (it took over while this one could
                # not reach the database): nothing of ours may be appended or acted on.
                self.fenced = True
                raise Fenced(self.call_id, self.epoch, self.state.epoch)
        before, at = self.state.version, now_us()
        batch: list[ev.Event] = []
        taken: list[Observation | ev.Event] = []
        # Decide and fold before appending, stamped with the time the store will record
        # (`recorded_at_us`): the in-memory state is exactly the fold of the log, without
        # reading back what was written (that read doubled the cost of every event). On any
        # failure the state is re-read from the log.
        try:
            while self._notes:
                item = self._notes.popleft()
                taken.append(item)
                # Facts from the wire (noted events, observations) go through `storable`;
                # a `Then` is the service's own decision.
                found = ((item(self.state) or []) if callable(item)
                         else storable([item] if isinstance(item, ev.Event)
                                       else decide(self.state, item, self.policy),
                                       self.state.generation))
                batch += self._stage(found, at)
            mine = self._stage(what if isinstance(what, list) else storable(
                decide(self.state, what, self.policy), self.state.generation), at)
            if then is not None:
                mine += self._stage(then(self.state) or [], at)
        except BaseException:
            self._stale = True
            self._notes.extendleft(reversed(taken))
            raise
        batch += mine
        if not batch:
            return mine
        try:
            await self.store.append(self.call_id, batch, before, epoch=self.epoch,
                                    recorded_at_us=at, timeout=timeout,
                                    urgent=any(isinstance(e, _ACTED_ON) for e in batch))
        except Fenced:
            self.fenced = True
            self._stale = True
            raise
        except ConcurrencyConflict:
            # Someone else wrote to our call: only a newer worker may. Re-read to find out.
            self._notes.extendleft(reversed(taken))
            await self._reload()
            if self.state.epoch > self.epoch:
                self.fenced = True
                raise Fenced(self.call_id, self.epoch, self.state.epoch) from None
            raise
        except BaseException:
            # Committed or not, the log says on the next use. Noted facts are decided again
            # then (a lost tool call would leave the model waiting for ever) — unless the
            # log shows this very append committed (a caller cancelled while the store's
            # writer went on: seen when a reconnect cancelled the receive loop mid-append,
            # which logged a handle twice).
            self._stale = True
            self._notes.extendleft(reversed(taken))
            try:
                self._unsure = (before, [(e.TYPE, canonical_json(e.to_data())) for e in batch],
                                len(taken))
            except (TypeError, ValueError):  # the append refused them: nothing was written
                self._unsure = None
            raise
        if self.on_commit is not None:
            self.on_commit(self.state)
        return mine

    def _stage(self, events: list[ev.Event], at: int) -> list[ev.Event]:
        """Fold events into the state as the log will record them (decoded from the very
        JSON that is stored, so upcasting and defaults apply exactly as for a reader)."""
        for e in events:
            fold_into(self.state, [RecordedEvent(
                self.call_id, self.state.version + 1, 0, e.TYPE, e.SCHEMA,
                canonical_json(e.to_data()), at, "")])
        return list(events)

    async def _reload(self) -> None:
        self.state = await load_state(self.store, self.call_id,
                                      use_snapshot=not self._full_history, **self._compaction)
        if self._unsure is not None:
            before, rows, noted = self._unsure
            if self.state.version >= before + len(rows):
                stored = await self.store.read(self.call_id, before + 1, before + len(rows))
                if [(r.type, r.data_json) for r in stored] == rows:
                    for _ in range(noted):  # they are in the log: do not append them again
                        self._notes.popleft()
            self._unsure = None
        self._stale = False

    def due(self) -> list[Effect]:
        # Nothing is due from a state that may hold events a failed append did not store:
        # the next record/observe re-reads the log first.
        if self.fenced or self._stale or self.state.epoch > self.epoch:
            return []  # (a newer worker's state, read by ensure_history: not ours to act on)
        return due(self.state, self.policy, now_us())

    def resumption_handle(self, exclude: set[str] = frozenset()) -> str | None:
        """The newest handle the log allows, other than `exclude` (refused by the server)."""
        return choose_resumption(self.state, self.policy, now_us(), exclude)
