"""Many calls appending at once while the database fails, and the checks afterwards.

Each simulated call appends the event mix of a voice call (the pattern of bench/callmix.py:
speech starts and stops, tool calls requested/deferred, started, completed with the send
intent, confirmed, transcripts, resumption handles) as one coroutine, with one append in
flight at a time, as the service's CallDriver does. Every append is written down with its
outcome: acknowledged (the version returned), failed (which error, after how long), and —
for a failed one — the version the call found when it read its stream again, as the
CallDriver does before its next append (a failed append may have committed anyway: its
acknowledgement, not its commit, was lost).

`check_log` then holds the log against that ledger: every acknowledged append is there,
exactly, at its versions; an append that failed is either wholly there or wholly absent,
as the re-read said; nothing else is there; versions run 1..N without a gap; every hash
chain verifies.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from session_store import SqlEventStore, StoreUnavailable
from session_store import events as ev
from session_store.events import canonical_json
from session_store.audit.verify import verify_log

TOOLS = ("lookup_order", "check_stock", "book_delivery_slot")


def call_steps(rng: random.Random, call: str,
               pace: float) -> Iterator[tuple[float, list[ev.Event]]]:
    """(pause before it, events of one append) for one call, forever. `pace` scales the pauses
    (1.0 = the tempo of a real call, ~2 appends per second)."""
    def u(a: float, b: float) -> float:
        return rng.uniform(a, b) * pace

    gen, seq = 1, 0
    yield 0.0, [ev.SessionOpened("models/gemini-live", list(TOOLS), "fault-worker", 1, {})]
    yield u(0.1, 0.3), [ev.Connected(gen, None, "0" * 64)]
    while True:
        seq += 1
        yield u(0.3, 1.5), [ev.ConversationMessage("user", f"{call} turn {seq}", gen)]
        yield u(0.1, 0.4), [ev.BotStartedSpeaking(gen)]
        cid = f"fc-{seq}" if rng.random() < 0.5 else None
        if cid:
            yield u(0.1, 0.4), [ev.ToolCallRequested(cid, rng.choice(TOOLS), {"n": seq}, gen),
                                ev.ToolCallDeferred(cid)]
        stop: list[ev.Event] = [ev.BotStoppedSpeaking(gen)]
        if cid:
            stop.append(ev.ToolCallStarted(cid, 1, f"{call}:{cid}:1", 1))
        yield u(0.3, 1.5), stop
        if cid:
            yield u(0.05, 0.3), [ev.ToolCallCompleted(cid, {"ok": True, "n": seq}),
                                 ev.ToolResultSending(cid, gen, "tool_response")]
            yield u(0.01, 0.05), [ev.ToolResultSent(cid, gen, "tool_response")]
        yield u(0.05, 0.2), [ev.ConversationMessage("assistant", f"{call} answer {seq}", gen)]
        yield u(0.05, 0.2), [ev.HandleIssued(gen, f"h-{call}-{seq}", seq)]


@dataclass
class Append:
    """One append as its caller saw it."""
    stream: str
    expected: int
    rows: list[tuple[str, str]]  # (type, canonical JSON): what must be stored
    timeout: float
    issued: float  # time.monotonic()
    ended: float = 0.0
    version: int | None = None  # acknowledged: the version returned
    error: BaseException | None = None
    reread: int | None = None  # after a failure: the stream's version read back

    @property
    def waited(self) -> float:
        return self.ended - self.issued

    @property
    def acknowledged(self) -> bool:
        return self.version is not None


@dataclass
class Load:
    """`calls` simulated calls on `store`; every `short_every`-th call gives its appends a
    short bounded wait (`short_timeout`), the others the store's default."""
    store: SqlEventStore
    calls: int = 100
    pace: float = 1.0
    short_every: int = 4
    short_timeout: float = 0.8
    long_timeout: float = 30.0
    prefix: str = "call"
    seed: int = 1
    appends: list[Append] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    reread_attempts: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def stream(self, i: int) -> str:
        return f"{self.prefix}-{i:03d}"

    async def run_call(self, i: int) -> None:
        rng = random.Random(self.seed * 1_000_003 + i)
        sid = self.stream(i)
        timeout = self.short_timeout if i % self.short_every == 0 else self.long_timeout
        version = 0
        await asyncio.sleep(rng.uniform(0, 1.0))  # calls start at different moments
        for pause, events in call_steps(rng, sid, self.pace):
            with _suppress_timeout():
                await asyncio.wait_for(self._stop.wait(), pause)
            # A step the log did not take is tried again (as the service keeps a fact it
            # could not log): a call's events stay a valid call, whose chain `verify` folds.
            while not self._stop.is_set():
                a = Append(sid, version, [(e.TYPE, canonical_json(e.to_data())) for e in events],
                           timeout, time.monotonic())
                self.appends.append(a)
                try:
                    a.version = await self.store.append(sid, events, version, timeout=timeout)
                    version = a.version
                    a.ended = time.monotonic()
                    break
                except StoreUnavailable as exc:
                    a.error = exc
                    # As the CallDriver does: the log says what happened (the append may have
                    # committed before its acknowledgement was lost). Reads fail while the
                    # database is down; keep trying, as the next append would.
                    a.ended = time.monotonic()
                    a.reread = await self._reread(sid)
                    committed = a.reread != version
                    version = a.reread
                    if committed:
                        break
                except Exception as exc:  # noqa: BLE001 - any other error is a finding
                    a.error = exc
                    self.unexpected.append(f"{sid}@{version}: {type(exc).__name__}: {exc}")
                    a.ended = time.monotonic()
                    return
            if self._stop.is_set():
                return

    async def _reread(self, sid: str) -> int:
        deadline = time.monotonic() + 120
        while True:
            self.reread_attempts += 1
            try:
                return await self.store.stream_version(sid)
            except StoreUnavailable:  # the database is still down (any other error: a finding)
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def run(self, fault) -> None:
        """Run every call while `fault()` runs; stop the calls when it returns, wait for
        the appends in flight."""
        tasks = [asyncio.create_task(self.run_call(i)) for i in range(self.calls)]
        try:
            await fault()
        finally:
            self._stop.set()
            await asyncio.gather(*tasks)

    # ------------------------------------------------------------------ figures
    def issued_between(self, t0: float, t1: float) -> list[Append]:
        return [a for a in self.appends if t0 <= a.issued <= t1]

    def summary(self) -> dict:
        acked = [a for a in self.appends if a.acknowledged]
        failed = [a for a in self.appends if a.error is not None]
        in_doubt = [a for a in failed if a.reread is not None and a.reread > a.expected]
        return {"appends": len(self.appends), "acknowledged": len(acked),
                "failed": len(failed), "failed_but_committed": len(in_doubt),
                "failed_by_deadline_s": {str(t): sum(1 for a in failed if a.timeout == t)
                                         for t in sorted({a.timeout for a in failed})},
                "unexpected_errors": len(self.unexpected),
                "waited_over_0.5s": sum(1 for a in acked if a.waited > 0.5),
                "max_wait_acknowledged_s": round(max((a.waited for a in acked), default=0), 2),
                "max_wait_failed_s": round(max((a.waited for a in failed), default=0), 2),
                "events_acknowledged": sum(len(a.rows) for a in acked)}


class _suppress_timeout:
    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        return exc_type is asyncio.TimeoutError


async def check_log(store: SqlEventStore, load: Load, *, slack: float = 5.0) -> dict:
    """The log against the ledger (see the module docstring). Returns the figures."""
    assert not load.unexpected, f"appends failed with an error other than StoreUnavailable: " \
                                f"{load.unexpected[:5]}"
    for a in load.appends:
        if a.error is None:
            continue
        # Bounded: a failed append gave up after its own deadline, not before (it was promised
        # that long) and not long after (it must not hang). Generous: the machine is shared.
        assert a.waited >= a.timeout - 0.05, (
            f"{a.stream}@{a.expected}: failed after {a.waited:.2f}s, before its own "
            f"{a.timeout}s deadline: {a.error}")
        assert a.waited <= a.timeout + slack, (
            f"{a.stream}@{a.expected}: failed only after {a.waited:.2f}s (deadline {a.timeout}s)")
        assert "deadline" in str(a.error), a.error
    by_stream: dict[str, list[Append]] = {}
    for a in load.appends:
        by_stream.setdefault(a.stream, []).append(a)
    reports = {r.stream_id: r for r in await verify_log(store)}
    for sid, appends in by_stream.items():
        log = await store.read(sid)
        versions = [r.version for r in log]
        assert versions == list(range(1, len(log) + 1)), f"{sid}: versions not contiguous"
        stored = [(r.type, r.data_json) for r in log]
        at = 0
        for a in appends:
            assert a.expected == at, f"{sid}: append expected {a.expected}, the log was at {at}"
            n = len(a.rows)
            if a.acknowledged:
                assert a.version == at + n, f"{sid}: acknowledged {a.version}, expected {at + n}"
                assert stored[at:at + n] == a.rows, f"{sid}: acknowledged v{at + 1}.. not stored"
                at += n
            elif a.reread is not None and a.reread != at:
                # Committed although its caller heard StoreUnavailable: all of it, or nothing.
                assert a.reread == at + n and stored[at:at + n] == a.rows, (
                    f"{sid}: a failed append left v{at + 1}..{a.reread}, not its own events")
                at += n
        assert at == len(log), f"{sid}: {len(log) - at} event(s) in the log no append wrote"
        assert await store.stream_version(sid) == len(log), f"{sid}: head != last event"
        assert reports[sid].ok, reports[sid]
    return load.summary()
