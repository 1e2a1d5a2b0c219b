"""How late an event loop ran: for the fleet and bench/call_start.py, not the product.

A timer wakes every `TICK_S`; a wake-up later than due means the loop was busy (or the
process got no CPU) for that long, and nothing else on it ran either: a worker's audio
pacing, a caller stand-in's stamp of the audio it received. Each late wake-up is kept as
(wall-clock time of the wake-up, seconds late): the loop was blocked over
[at - late, at], on the same clock (time.time()) in every process of a run.

`probed(app)` is the phone bot's web app with the probe running for its lifespan and its
samples at GET /rig/loop-lag (the fleet's and the bench's workers run it; the product
does not).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from contextlib import asynccontextmanager

TICK_S = 0.005
FLOOR_S = 0.001  # later than this is kept


class LoopLag:
    """The running loop's late wake-ups, sampled from `start()` to `stop()`."""

    def __init__(self, tick_s: float = TICK_S, floor_s: float = FLOOR_S):
        self.tick_s, self.floor_s = tick_s, floor_s
        self.samples: list[tuple[float, float]] = []  # (at, seconds late)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.tick_s)
            late = loop.time() - before - self.tick_s
            if late > self.floor_s:
                self.samples.append((time.time(), late))

    def worst(self, since: float, until: float) -> float:
        return worst(self.samples, since, until)


def worst(samples: Iterable[tuple[float, float]], since: float, until: float) -> float:
    """The longest blocking that overlaps [since, until] (seconds; 0 if none)."""
    return max((late for at, late in samples if at >= since and at - late <= until),
               default=0.0)


def blocked(samples: Iterable[tuple[float, float]], since: float, until: float) -> float:
    """How long the loop was blocked within [since, until], summed (seconds)."""
    return sum(max(0.0, min(at, until) - max(at - late, since)) for at, late in samples)


def probed(app):
    """`app` (a FastAPI app with a lifespan) with a LoopLag running while it serves, and
    its samples at GET /rig/loop-lag?since=&until= (wall-clock seconds)."""
    probe = LoopLag()
    served = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application):
        probe.start()
        try:
            async with served(application) as state:
                yield state
        finally:
            await probe.stop()

    app.router.lifespan_context = lifespan

    @app.get("/rig/loop-lag")
    async def loop_lag(since: float = 0.0, until: float = 1e12) -> dict:
        return {"samples": [[at, late] for at, late in probe.samples
                            if at >= since and at - late <= until]}

    return app


def _phone_bot_app():
    from .server import app
    return probed(app)


def __getattr__(name: str):
    # `uvicorn examples.phone_bot.loop_lag:app`: the phone bot's app, probed (built on
    # first use, so importing the probe does not import the server).
    if name == "app":
        globals()["app"] = application = _phone_bot_app()
        return application
    raise AttributeError(name)
