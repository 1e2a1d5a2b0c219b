"""The service's handle on its call's log: observe → decide → due → append → fold.

This is the imperative shell's only path to the log, and it has no pipecat in it. Live
operation and takeover after a crash use it the same way: `attach()` loads the state (and, for
an existing call, records the new worker with a higher fencing epoch); then every step is one
`observe` (or `record`, for events the service decided itself): the facts noted in order and
the observation are decided on the log, `due` is asked once on the state they leave, and the
intents of the effects the caller will perform go into the same append (a `Decision`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from session_store import Policy, SessionState, choose_resumption, decide, due, load_state
from session_store import events as ev
from session_store.checks import check_count
from session_store.decide import (HandshakeFailed, Observation, handshake_refused,
                                  handshake_verdict)
from session_store.delivery import Effect
from session_store.errors import CallClosed, ConcurrencyConflict, Fenced, StreamDamaged
from session_store.events import canonical_json
from session_store.intents import SENDS, intents
from session_store.storage.loading import snapshot_of
from session_store.observed import observation_record
from session_store.projection import HistoryNeeded, fold_into
from session_store.records import RecordedEvent
from session_store.storage.schema import STREAM_ID_MAX, valid_id
from session_store.state import Withholding
from session_store.storable import storable_events
from session_store.storage import Snapshot, SqlEventStore
from session_store.withholding import after_all

from . import observe
from .takeover import catch_up, check_tail

log = logging.getLogger(__name__)

#: Rounds of read-and-append an attach makes while other workers take the call over too (each
#: round it loses, another one won).
ATTACH_TRIES = 8

#: Events the service acts on the moment their commit returns (run a tool, send a result):
#: their appends are `urgent` (SQLite may commit them on the loop's thread, no hand-off).
_ACTED_ON = (ev.ToolCallStarted, ev.ToolResultSending)

NOTHING: frozenset[type] = frozenset()


@dataclass
class Decision:
    """What one commit decided: the caller's events and the intents it logged (noted facts
    excluded), and the effects `due` found on the state with the caller's events folded in."""

    events: list[ev.Event] = field(default_factory=list)
    #: Asked only when the commit logs intents (`intend`): `due` walks every call.
    effects: list[Effect] = field(default_factory=list)
    intents: list[ev.Event] = field(default_factory=list)
    #: The log's version at which `effects` is still what `due` says (no intent was staged
    #: after it was asked); None if it was not asked, or intents changed the state.
    due_at: int | None = None
    #: Set by the step that performed it (service/step.py): anything was done.
    acted: bool = False


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def now_us() -> int:
    return time.time_ns() // 1000


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
        self._notes: deque[Observation | ev.Event] = deque()
        # Called with the state after each commit (the service wakes lazy notes with it).
        self.on_commit: Callable[[SessionState], None] | None = None
        # Whether the live session can carry a send now (the service's link says), asked
        # on the state being committed: a send's intent is logged only if it can go.
        self.can_send: Callable[[], bool] = lambda: True
        self._stale = False  # a failed append left the state unsure: re-read before use
        # (version before, rows, how many noted items) of an append whose outcome is unknown
        # (it failed or its caller was cancelled, possibly after the commit).
        self._unsure: tuple[int, list[tuple[str, str]], int] | None = None
        self._full_history = False  # reload from the whole log, not a snapshot
        self.snapshot_every = snapshot_every
        self._snapshot_version = 0
        self._snapshot_task: asyncio.Task | None = None

    async def attach(self, *, model: str, tools: list[str], settings: dict) -> SessionState:
        """Open the call, or take it over: a new fencing epoch shuts the old worker out (I6).

        A takeover does not race the old worker for a version (`store.take_over`): its
        WorkerAttached goes at whatever version the head is, so an old worker appending as
        fast as it can never starves it. What that worker committed before it is folded in
        before this returns; it only loses to another takeover, and then goes above it."""
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
                await check_tail(self.store, self.call_id, state)
                epoch = state.epoch + 1
                at = now_us()
                try:
                    first: ev.Event
                    if not state.opened:
                        first = ev.SessionOpened(model, tools, self.worker_id, epoch, settings)
                        await self.store.append(self.call_id, [first], state.version,
                                                epoch=epoch, recorded_at_us=at)
                    else:
                        first = ev.WorkerAttached(self.worker_id, epoch, "takeover")
                        version = await self.store.take_over(
                            self.call_id, [first], epoch, after_version=state.version,
                            recorded_at_us=at)
                        state, whole = await catch_up(self.store, self.call_id, state,
                                                      version - 1, self._compaction)
                        self._full_history |= whole
                except ConcurrencyConflict as exc:
                    # Another worker opened the call, or took it over first (Fenced: our
                    # epoch is already too old): read again and retry.
                    conflict = exc
                    await asyncio.sleep(random.uniform(0, 0.02))  # de-synchronise racers
                    continue
                self.state = state
                self._stage([first], at)
                self.epoch = epoch
                if observe.SINKS:
                    observe.committed(self, [first])
                return self.state
            raise ConcurrencyConflict(
                self.call_id, state.version,
                conflict.actual if conflict is not None else None) from conflict

    async def observe(self, obs: Observation | None = None, *, intend: frozenset[type] = NOTHING,
                      timeout: float | None = None) -> Decision:
        """One step of the flow, in one append: what was noted, then `obs` and what `decide`
        makes of it; then, if `intend` names kinds of effects, `due` is asked once on the
        state that leaves and the intents of the effects of those kinds go in too (sends only
        if `can_send()`). The caller performs them after this returns, never before.
        `obs` None: only what was noted. `timeout`: how long the store may wait for a
        database that is down (its default otherwise); the notes stay queued if it gives up."""
        async with self._lock:
            return await self._commit(obs, intend, timeout)

    async def record(self, *events: ev.Event, intend: frozenset[type] = NOTHING) -> Decision:
        """As `observe`, for events the service decided itself (an intent, an outcome)."""
        async with self._lock:
            return await self._commit(list(events), intend)

    def note(self, item: Observation | ev.Event) -> None:
        """Queue a fact that must be logged in order but need not hold up the caller (a
        resumption handle, speech starting on the audio path): it is decided and appended
        with the next record or observe, ahead of their events, in the order noted (an
        observation is decided on the state as it is when logged: a tool result whose own
        append failed is logged unless that append committed after all)."""
        self._notes.append(item)

    @property
    def has_notes(self) -> bool:
        return bool(self._notes)

    @property
    def pending_notes(self) -> int:
        return len(self._notes)

    def gate(self) -> Withholding:
        """The handles' gate as the log will hold it once the noted facts are in: what a
        fact noted now is logged against (service/handle_gate.py)."""
        return after_all(self.state.withholding, self._notes)

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

    async def _commit(self, what: list[ev.Event] | Observation | None, intend: frozenset[type],
                      timeout: float | None = None) -> Decision:
        try:
            decision = await self._commit_once(what, intend, timeout)
        except HistoryNeeded:
            # Staging needed what the snapshot left out (a fresh session, an archived call):
            # nothing was appended; decide again on the whole history.
            self._full_history = True
            await self._reload()
            decision = await self._commit_once(what, intend, timeout)
        self._maybe_snapshot()
        return decision

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

    async def _commit_once(self, what: list[ev.Event] | Observation | None,
                           intend: frozenset[type], timeout: float | None = None) -> Decision:
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
        decision = Decision()
        # Decide and fold before appending, stamped with the time the store will record
        # (`recorded_at_us`): the in-memory state is exactly the fold of the log, without
        # reading back what was written (that read doubled the cost of every event). On any
        # failure the state is re-read from the log.
        try:
            while self._notes:
                item = self._notes.popleft()
                taken.append(item)
                batch += self._stage(self._decided(item, at), at)
            if what is not None:
                decision.events = self._stage(
                    what if isinstance(what, list) else self._decided(what, at), at)
            if intend:
                decision.effects = self.due()
                kinds = intend if self.can_send() else intend - SENDS
                decision.intents = self._stage(
                    intents(self.state, decision.effects, kinds, self.epoch), at)
                decision.events += decision.intents
                if not decision.intents:
                    decision.due_at = self.state.version
        except BaseException:
            self._stale = True
            self._notes.extendleft(reversed(taken))
            raise
        batch += decision.events
        if not batch:
            return decision
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
        if observe.SINKS:
            observe.committed(self, batch)
        if self.on_commit is not None:
            self.on_commit(self.state)
        return decision

    def _decided(self, item: Observation | ev.Event, at: int) -> list[ev.Event]:
        """A fact from the wire as the log takes it (recorded at `at`): an event as it is, an
        observation as `decide` rules on the state now, after the observation itself (if it
        decided anything); either way storable."""
        if isinstance(item, ev.Event):
            return storable_events([item], self.state.generation)
        found = storable_events(decide(self.state, item, self.policy, at), self.state.generation)
        # What it was decided on goes first, in the same append: replay decides it again.
        return [observation_record(item, found, self.state), *found] if found else []

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

    async def close(self, reason: str) -> None:
        """Record the end of the call (and of its live session, if any), unless it is over
        or no longer this worker's."""
        if self.fenced or self.state.closed:
            return
        events: list[ev.Event] = []
        if self.state.connected:
            events.append(ev.Disconnected(self.state.generation, "shutdown"))
        events.append(ev.SessionClosed(reason))
        await self.record(*events)

    def due(self) -> list[Effect]:
        # Nothing is due from a state that may hold events a failed append did not store:
        # the next record/observe re-reads the log first.
        if self.fenced or self._stale or self.state.epoch > self.epoch:
            return []  # (a newer worker's state, read by ensure_history: not ours to act on)
        return due(self.state, self.policy, now_us())

    def resumption_handle(self, requested: str | None = None) -> str | None:
        """The handle a new session resumes from: `requested` (chosen before) unless the server
        has refused it since, else the newest the log allows. A failed handshake noted and not
        logged yet (the log is down) counts already: the server's answer stands either way."""
        refused: set[str] = set()
        earlier: dict[str, int] = {}
        for n in self._notes:  # the failed handshakes noted, as decide will rule on them
            if isinstance(n, HandshakeFailed) and n.handle:
                if handshake_verdict(self.state, n.handle, handshake_refused(n),
                                     earlier.get(n.handle, 0))[1]:
                    refused.add(n.handle)
                earlier[n.handle] = earlier.get(n.handle, 0) + 1
        known = self.state.handles.get(requested) if requested is not None else None
        if requested is not None and requested not in refused and not (known and known.refused):
            return requested
        return choose_resumption(self.state, self.policy, now_us(), refused)
