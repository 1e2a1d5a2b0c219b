"""Write-ahead for a tool re-run after a takeover: the run starts only once its
`tool.call_started` is committed (real service, real pipeline, local server).

The dead worker left an idempotent call in doubt (started, no outcome); the new worker
re-runs it (attempt 2, same key) through the service's effects path. If the tool started
before that start was in the log, a crash in between would leave a run the log does not
know of, and the next worker would run it again. The crash harness cannot see this (its
kills land after a commit, and its tools take longer than a commit), so the start's commit
is slowed here. (Found by mutation testing: running the calls `_perform` starts before
committing their start left every test green.)"""

from __future__ import annotations

import asyncio
import time

import pytest
from pipecat.frames.frames import EndFrame, LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.driver import now_us
from service.gemini_live import DurableGeminiLiveLLMService
from service.local_live import LocalLiveServer, Script
from rig.testing.pipeline import MODEL, PlaybackOutput, run_worker, tools_schema
from session_store import Policy, load_state
from session_store import events as ev
from session_store.delivery import undelivered
from tests.service.helpers import PROMPT, TOOLS, Tap, TimedLedger, make_tool


@pytest.mark.timeout(60)
async def test_an_in_doubt_idempotent_call_reruns_only_after_its_start_is_committed(store):
    call_id = "review-write-ahead"
    await store.append(call_id, [
        ev.SessionOpened(MODEL, list(TOOLS), "dead-worker", 1,
                         {"model": MODEL, "system_instruction": PROMPT}),
        ev.Connected(1, None, "x"),
        ev.ConversationMessage("user", "Hello", 1),
        ev.ToolCallRequested("c1", "lookup_order", {"id": 1}, 1),
        ev.ToolCallStarted("c1", 1, f"{call_id}:c1", 1),
    ], 0, epoch=1, recorded_at_us=now_us())

    committed: dict[str, float] = {}
    real_append = store.append

    async def slow_start_append(stream_id, events, *args, **kwargs):
        starts = [e for e in events if isinstance(e, ev.ToolCallStarted)]
        if starts:
            await asyncio.sleep(0.5)
        out = await real_append(stream_id, events, *args, **kwargs)
        for e in starts:
            committed.setdefault(e.call_id, time.time())
        return out

    ledger, tap = TimedLedger(), Tap()
    store.append = slow_start_append
    try:
        async with LocalLiveServer(Script()) as server:
            llm = DurableGeminiLiveLLMService(
                api_key="local-test-key",
                settings=GeminiLiveLLMService.Settings(model=MODEL, system_instruction=PROMPT),
                tools=tools_schema(list(TOOLS)), http_options=server.http_options(),
                store=store, call_id=call_id, worker_id="new-worker",
                policy=Policy(idempotent=frozenset({"lookup_order"})))
            for name in TOOLS:
                llm.register_function(name, make_tool(name, ledger, 0.01))
            context = LLMContext(messages=[{"role": "user", "content": "Hello"}])
            aggregators = LLMContextAggregatorPair(context)
            task = PipelineWorker(Pipeline([aggregators.user(), llm, PlaybackOutput(), tap,
                                          aggregators.assistant()]),
                                params=PipelineParams(), cancel_on_idle_timeout=False)
            run = asyncio.create_task(run_worker(task))
            try:
                await task.queue_frames([LLMRunFrame()])
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and not any(
                        r.id == "c1" for r in server.tool_responses()):
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)
            finally:
                await task.queue_frame(EndFrame())
                done, _ = await asyncio.wait({run}, timeout=3)
                if not done:
                    await task.cancel()
                    await asyncio.gather(run, return_exceptions=True)
            delivered = [r for r in server.tool_responses() if r.id == "c1"]
    finally:
        store.append = real_append

    runs = [r for r in ledger.runs if r["call_id"] == "c1"]
    assert len(runs) == 1, runs
    assert "c1" in committed, "the re-run's start was never committed"
    assert runs[0]["t"] >= committed["c1"], (
        f"c1 ran {committed['c1'] - runs[0]['t']:.2f}s before its start was committed")
    state = await load_state(store, call_id, use_snapshot=False)
    c1 = state.calls["c1"]
    assert c1.status == "completed" and c1.attempt == 2 and c1.idempotency_key == f"{call_id}:c1"
    assert len(delivered) == 1 and not undelivered(state)
