"""A pipecat pipeline's pieces for running the service without audio devices: an output
transport that "plays" audio in real time (so the bot's speaking state comes from pipecat's own
transport logic), the tools' schema and pipecat's runner. Shipped because `session-store
reproduce` re-runs a logged call with them; the test rigs use them too.
"""

from __future__ import annotations

import asyncio

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import StartFrame
from pipecat.pipeline.worker import PipelineWorker
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner


class PlaybackOutput(BaseOutputTransport):
    """Output transport stand-in: no device; audio takes its real duration to play."""

    def __init__(self, **kwargs):
        super().__init__(TransportParams(audio_out_enabled=True, audio_out_sample_rate=24000,
                                         audio_out_end_silence_secs=0), **kwargs)

    async def start(self, frame: StartFrame):
        await super().start(frame)
        await self.set_transport_ready(frame)  # the base class does not; without it no audio plays

    async def write_audio_frame(self, frame) -> bool:
        await asyncio.sleep(len(frame.audio) / (2 * frame.sample_rate))
        return True


def tools_schema(names: list[str], descriptions: dict[str, str] | None = None) -> ToolsSchema:
    descriptions = descriptions or {}
    return ToolsSchema(standard_tools=[
        FunctionSchema(name=n, description=descriptions.get(n, f"{n} tool"),
                       properties={"id": {"type": "integer"}}, required=[]) for n in names])


async def run_worker(worker: PipelineWorker) -> None:
    """Run one pipeline to its end, as pipecat 1.14 runs workers (a runner that is handed the
    worker in run() is deprecated)."""
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()
