"""A worker started on a call that already ended ends its pipeline at once (issue #34, item 7).

The service refuses the call at setup (CallClosed, test_takeover_seed.py); pipecat reported
that and then waited its 20 s start timeout for a StartFrame that could not get through, the
worker holding its slot (and the phone line) all that time. Now the service ends the
pipeline itself, says why, and opens no Gemini session.
"""

from __future__ import annotations

import asyncio
import time

from pipecat.frames.frames import LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.driver import CallDriver
from service.gemini_live import DurableGeminiLiveLLMService
from rig.testing.pipeline import MODEL, run_worker
from session_store import Policy
from session_store import events as ev

#: pipecat's start timeout is 20 s: well under it, and slack for a loaded machine.
PROMPTLY_S = 5.0


async def test_a_worker_on_an_ended_call_ends_promptly_and_opens_no_session(
        store, monkeypatch):
    driver = CallDriver(store, "ended-call", Policy(), worker_id="w1")
    await driver.attach(model=MODEL, tools=[], settings={})
    await driver.record(ev.SessionClosed("ended"))
    before = await store.read("ended-call")

    connects: list[str] = []

    async def no_connect(self, session_resumption_handle=None):
        connects.append("connect")  # (pipecat's own connect: a session would be opened)

    monkeypatch.setattr(GeminiLiveLLMService, "_connect", no_connect)
    llm = DurableGeminiLiveLLMService(
        api_key="local-test-key", settings=DurableGeminiLiveLLMService.Settings(model=MODEL),
        store=store, call_id="ended-call", policy=Policy())
    worker = PipelineWorker(Pipeline([llm]), params=PipelineParams(),
                            cancel_on_idle_timeout=False)
    await worker.queue_frames([LLMRunFrame()])
    started = time.monotonic()
    await asyncio.wait_for(run_worker(worker), 30)
    took = time.monotonic() - started
    assert took < PROMPTLY_S, f"the worker took {took:.1f} s to end"
    assert connects == [], "a Gemini session was opened for an ended call"
    assert await store.read("ended-call") == before, "a worker wrote after the end"
