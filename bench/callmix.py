"""Shared by the benchmarks: the scripted event mix of a real call, latency statistics, an
event-loop lag probe and private PostgreSQL schemas. Not a benchmark itself.

`call_script` yields the appends of one voice call in the order the service makes them,
each with the pause before it: the user speaks (0.5-2 s), the bot starts speaking, half of
the turns ask for a tool while the bot speaks (requested + deferred in one append, as
`CallDriver.observe(..., intend=)` does), the tool starts when the bot stops, its result is
recorded with the write-ahead send intent, confirmed, the bot speaks the answer, the
transcript lines and a fresh resumption handle are logged, and every 8th turn the server
sends goAway and the call reconnects on a new generation with the newest handle.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import math
import os
import random
import statistics
import time
import uuid
from collections.abc import Iterator

import asyncpg

from session_store import events as ev

PG_URL = os.environ.get("SESSION_STORE_BENCH_PG",
                        "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PG_DSN = PG_URL.replace("postgresql+asyncpg", "postgresql")
MODEL = "models/gemini-2.5-flash-native-audio-preview"
TOOLS = ["lookup_order", "check_stock", "book_delivery_slot"]
USER_LINES = [
    "Hi, I ordered a pair of running shoes last week and they still have not arrived.",
    "The order number is 48213, it was supposed to come on Tuesday.",
    "Can you check whether the blue ones in size 43 are back in stock?",
    "Friday morning would work for me, between nine and twelve if possible.",
    "No, that is all, thank you very much for your help today.",
]
BOT_LINES = [
    "Let me look that up for you. Order 48213 shipped on Tuesday and is with the courier now.",
    "The blue model in size 43 is back in stock at the central warehouse, twelve pairs left.",
    "I have booked a delivery slot on Friday between nine and twelve; you will get a text.",
    "You are welcome. Is there anything else I can help you with today?",
]
SYSTEM_SHA = hashlib.sha256(b"You are the order desk of a shoe shop.").hexdigest()


def _handle(rng: random.Random) -> str:
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=48))


def call_script(rng: random.Random, call_id: str, *, first_delay: float = 0.0,
                worker: str = "bench-worker", epoch: int = 1
                ) -> Iterator[tuple[float, list[ev.Event]]]:
    """Yield (pause in seconds, events of one append) for one call, forever."""
    u = rng.uniform
    gen, index = 1, 0
    yield first_delay, [ev.SessionOpened(MODEL, TOOLS, worker, epoch,
                                         {"voice": "Puck", "language": "en-GB"})]
    yield 0.3, [ev.Connected(gen, None, SYSTEM_SHA)]
    yield 0.05, [ev.HandleIssued(gen, _handle(rng), index)]
    turn = 0
    while True:
        turn += 1
        index += 2
        yield u(0.5, 2.0), [ev.ConversationMessage("user", rng.choice(USER_LINES), gen)]
        yield u(0.2, 0.5), [ev.BotStartedSpeaking(gen)]
        cid = f"fc-{turn}" if rng.random() < 0.5 else None
        if cid:
            name = rng.choice(TOOLS)
            yield u(0.1, 0.5), [ev.ToolCallRequested(cid, name, {"order_id": 48213 + turn,
                                                                 "size": 43}, gen),
                                ev.ToolCallDeferred(cid)]
        stop: list[ev.Event] = [ev.BotStoppedSpeaking(gen)]
        if cid:
            stop.append(ev.ToolCallStarted(cid, 1, f"{call_id}:{cid}:1", epoch))
        yield u(0.5, 2.0), stop
        if cid:
            result = {"status": "shipped", "eta": "Friday", "tracking": "1Z999AA10123456784"}
            yield u(0.05, 0.3), [ev.ToolCallCompleted(cid, result),
                                 ev.ToolResultSending(cid, gen, "tool_response")]
            yield 0.01, [ev.ToolResultSent(cid, gen, "tool_response")]
            yield u(0.2, 0.5), [ev.BotStartedSpeaking(gen)]
            yield u(0.5, 2.0), [ev.BotStoppedSpeaking(gen)]
        yield 0.05, [ev.ConversationMessage("assistant", rng.choice(BOT_LINES), gen)]
        handle = _handle(rng)
        yield 0.05, [ev.HandleIssued(gen, handle, index)]
        if turn % 8 == 0:
            yield u(0.1, 1.0), [ev.GoAwayReceived(gen, 50.0)]
            yield 0.05, [ev.Disconnected(gen, "go_away")]
            gen += 1
            yield 0.2, [ev.Connected(gen, handle, SYSTEM_SHA)]


def scripted_steps(n: int, call_id: str, seed: int = 1) -> list[tuple[float, list[ev.Event]]]:
    """The appends of a scripted call holding its first `n` events, each with the time (in
    seconds from the start of the call) it is made: a long call's log as it was written."""
    out: list[tuple[float, list[ev.Event]]] = []
    at, count = 0.0, 0
    for pause, step in call_script(random.Random(seed), call_id):
        at += pause
        step = step[:n - count]
        out.append((at, step))
        count += len(step)
        if count >= n:
            return out
    raise AssertionError("unreachable")


def scripted_events(n: int, call_id: str, seed: int = 1) -> list[ev.Event]:
    """The first `n` events of a scripted call (pauses dropped): a long call's log."""
    out: list[ev.Event] = []
    for _, step in call_script(random.Random(seed), call_id):
        out.extend(step)
        if len(out) >= n:
            return out[:n]
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ statistics

async def median_ms(fn, repeats: int) -> float:
    """Median wall time of `await fn()` over `repeats` runs, in ms."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def machine() -> str:
    """CPUs and the 1-minute load average: other processes on the machine skew the tails."""
    return f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN when there is nothing to rank."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def ms(x: float) -> float:
    return round(x * 1e3, 3)


class LoopLagProbe:
    """Stands for the audio path: a task that sleeps 10 ms and records how late it wakes.

    Also records garbage-collector pauses, the usual non-database cause of a stall.
    """

    def __init__(self, period: float = 0.010):
        self.period = period
        self.lags: list[float] = []
        self.gc_pauses: list[float] = []
        self._window = (math.inf, math.inf)
        self._gc_start = 0.0

    def _on_gc(self, phase: str, _info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._gc_start = now
        elif self._window[0] <= now <= self._window[1]:
            self.gc_pauses.append(now - self._gc_start)

    async def run(self, start: float, end: float) -> None:
        """Tick until perf_counter() passes `end`; keep the lags of ticks that began after `start`."""
        self._window = (start, end)
        gc.callbacks.append(self._on_gc)
        try:
            while True:
                t = time.perf_counter()
                if t >= end:
                    return
                await asyncio.sleep(self.period)
                if t >= start:
                    self.lags.append(max(0.0, time.perf_counter() - t - self.period))
        finally:
            gc.callbacks.remove(self._on_gc)

    def summary(self) -> dict:
        return {"lag_p99_ms": ms(pct(self.lags, 99)), "lag_max_ms": ms(max(self.lags, default=0)),
                "stalls_over_20ms": sum(1 for x in self.lags if x > 0.020),
                "gc_max_ms": ms(max(self.gc_pauses, default=0))}


# ------------------------------------------------------------------ PostgreSQL schemas

async def pg_schema() -> str:
    """A private schema for one run (drop it with drop_schema)."""
    name = f"bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f"CREATE SCHEMA {name}")
    finally:
        await conn.close()
    return name


async def drop_schema(name: str) -> None:
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    finally:
        await conn.close()


async def pg_reachable() -> bool:
    try:
        conn = await asyncio.wait_for(asyncpg.connect(PG_DSN), 5)
    except (OSError, asyncio.TimeoutError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True
