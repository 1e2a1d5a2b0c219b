"""A real pipecat pipeline around a Gemini Live service, without audio devices.

`user aggregator → service → PlaybackOutput → assistant aggregator`, driven by pipecat's own
runner. PlaybackOutput is a BaseOutputTransport that "plays" audio in real time, so the bot's
speaking state comes from pipecat's transport logic exactly as in production.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from google.genai.types import HttpOptions
from pipecat.frames.frames import (EndFrame, Frame, FunctionCallResultProperties, LLMRunFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams

from service.headless_pipeline import PlaybackOutput, run_worker, tools_schema

MODEL = "models/gemini-2.5-flash-native-audio-preview"


@dataclass
class ToolLedger:
    """Side effects of the demo tools, one line per execution (the crash harness reads it)."""
    path: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)

    def write(self, entry: dict[str, Any]) -> None:
        self.runs.append(entry)
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()


def http_options_for(base_url: str, ssl_ctx) -> HttpOptions:
    return HttpOptions(base_url=base_url, async_client_args={"ssl": ssl_ctx})


def make_tool(name: str, ledger: ToolLedger, delay: float = 0.05, *,
              result: Callable[[dict], Any] | None = None, progress: int = 0):
    """A tool handler that records its side effect in the ledger, then answers (after
    `progress` intermediate results, `delay` apart: register it with
    cancel_on_interruption=False, as pipecat takes those only from async tools)."""

    async def handler(params: FunctionCallParams) -> None:
        key = None
        llm = params.llm
        if hasattr(llm, "idempotency_key"):
            key = llm.idempotency_key(params.tool_call_id)
        ledger.write({"tool": name, "call_id": params.tool_call_id, "args": params.arguments,
                      "idempotency_key": key})
        for step in range(1, progress + 1):
            await asyncio.sleep(delay)
            await params.result_callback({"tool": name, "step": step},
                                         properties=FunctionCallResultProperties(is_final=False))
        await asyncio.sleep(delay)
        value = result(params.arguments) if result else {"ok": True, "tool": name,
                                                           "args": params.arguments}
        await params.result_callback(value)

    return handler


async def run_pipeline(llm, *, frames: list[Frame] | None = None,
                       until: Callable[[], Awaitable[None]] | None = None,
                       initial_messages: list[dict] | None = None,
                       timeout: float = 30.0,
                       control: Callable[[PipelineWorker], Awaitable[None]] | None = None,
                       worker_options: dict | None = None) -> None:
    """Run `llm` in a real pipeline until `until()` (or `control(task)`, which may queue
    frames into the running task) returns, then end the pipeline. `worker_options`: more
    arguments of the PipelineWorker (enable_tracing, conversation_id, ...)."""
    context = LLMContext(messages=initial_messages or [{"role": "user", "content": "Hello"}])
    aggregators = LLMContextAggregatorPair(context)
    pipeline = Pipeline([aggregators.user(), llm, PlaybackOutput(), aggregators.assistant()])
    task = PipelineWorker(pipeline, params=PipelineParams(), cancel_on_idle_timeout=False,
                          **(worker_options or {}))

    async def drive() -> None:
        await task.queue_frames([LLMRunFrame(), *(frames or [])])
        if until is not None:
            await until()
        if control is not None:
            await control(task)
        await task.queue_frame(EndFrame())

    run = asyncio.create_task(run_worker(task))
    try:
        await asyncio.wait_for(asyncio.gather(run, drive()), timeout)
    finally:
        if not run.done():
            await task.cancel()
            await asyncio.gather(run, return_exceptions=True)
