"""What pipecat's default observers cost each frame, and what the phone bot saves without them.

A `PipelineWorker` adds observers by default (RTVI's, turn tracking, idle detection) and
hands every frame's push and every processor's handling of it to each observer through a
queue and a task of its own. The phone bot (examples/phone_bot/bot.py, `WORKER_OPTIONS`)
turns RTVI and turn tracking off: a phone has no RTVI client and nothing reads the turns
without tracing. This pushes caller-sized audio frames (20 ms at 16 kHz) through a pipeline
of five pass-through processors, with pipecat's defaults and with the phone bot's options,
alternately in one process, and prints the CPU time per frame (process time: what a worker
pays whatever else the machine runs).

    python bench/pipeline_observers.py            # 5 rounds of 5,000 frames per variant
    python bench/pipeline_observers.py --quick    # 2 rounds of 2,000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipecat.frames.frames import EndFrame, InputAudioRawFrame  # noqa: E402
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.frame_processor import FrameProcessor  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from examples.phone_bot.bot import WORKER_OPTIONS  # noqa: E402

FRAME = b"\0" * 640  # 20 ms of 16 kHz 16-bit mono, as the caller's audio reaches the service
HOPS = 5


class PassOn(FrameProcessor):
    """A processor that hands every frame on; the last one counts the audio frames."""

    def __init__(self, expect: int = 0, done: asyncio.Event | None = None):
        super().__init__()
        self._expect, self._seen, self._done = expect, 0, done

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if self._done is not None and isinstance(frame, InputAudioRawFrame):
            self._seen += 1
            if self._seen == self._expect:
                self._done.set()
        await self.push_frame(frame, direction)


async def cpu_per_frame_us(options: dict, frames: int) -> float:
    done = asyncio.Event()
    processors = [PassOn() for _ in range(HOPS - 1)] + [PassOn(frames, done)]
    worker = PipelineWorker(Pipeline(processors), params=PipelineParams(),
                            cancel_on_idle_timeout=False, **options)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    await asyncio.sleep(0.5)  # started, and its setup's CPU spent
    t0 = time.process_time()
    for i in range(frames):
        await worker.queue_frame(InputAudioRawFrame(audio=FRAME, sample_rate=16000,
                                                    num_channels=1))
        if i % 50 == 0:
            await asyncio.sleep(0)  # as frames arrive: the pipeline runs meanwhile
    await asyncio.wait_for(done.wait(), 120)
    cpu = time.process_time() - t0
    await worker.queue_frame(EndFrame())
    await asyncio.wait_for(running, 30)
    return cpu / frames * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2,000 frames (CI)")
    args = parser.parse_args()
    rounds, frames = (2, 2000) if args.quick else (5, 5000)
    variants = {"stock (pipecat's defaults)": {}, "phone bot (WORKER_OPTIONS)": WORKER_OPTIONS}
    figures: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        # Alternate which goes first: drift over the run hits both alike.
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            figures[name].append(await cpu_per_frame_us(variants[name], frames))
    stock, ours = (statistics.median(v) for v in figures.values())
    print(f"CPU per audio frame through {HOPS} processors, median of {rounds} rounds of "
          f"{frames} frames (us):")
    for name, values in figures.items():
        print(f"  {name:28} {statistics.median(values):7.1f}   rounds: "
              + " ".join(f"{v:.1f}" for v in values))
    print(f"ratio phone bot / stock: {ours / stock:.2f}")
    print(json.dumps({"bench": "pipeline_observers", "quick": args.quick, "hops": HOPS,
                      "stock_us": round(stock, 1), "ours_us": round(ours, 1),
                      "ratio": round(ours / stock, 3)}))


if __name__ == "__main__":
    from loguru import logger

    logger.remove()  # pipecat's INFO lines per worker would drown the figures
    asyncio.run(main())
