"""Takeover against a server that refuses, and a takeover raced by another (real service,
real pipeline, real google-genai client, local server).

1. A new worker whose chosen resumption handle the server refuses (expired, invalidated:
   refused every time; or failing with 1011 every time, after a retry) falls back to an
   older handle or a fresh, seeded session, and delivers the result the dead worker left
   undelivered. (It asked for the refused handle again until
   pipecat gave the service up: `_connect(None)` fell back to the handle it had stored.)
2. A worker fenced at its first `connection.connected` closes that Gemini session (pipecat
   had not made it `_session` yet, so nothing closed it).
"""

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
from session_store.decide import HANDLE_ATTEMPTS
from service.gemini_live import DurableGeminiLiveLLMService
from service.local_live import LocalLiveServer, Script
from rig.testing.pipeline import MODEL, PlaybackOutput, run_worker, tools_schema
from session_store import events as ev
from session_store import load_state
from session_store.delivery import undelivered
from tests.service.helpers import PROMPT, TOOLS, Tap, TimedLedger, make_tool

REFUSED = "handle-from-the-dead-worker"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("refusal", ["refused", "fails_every_time"])
async def test_takeover_whose_handle_is_refused_falls_back_to_a_fresh_session(store, refusal):
    """`refused`: the server refuses the handle as the API does (a client-error close, see
    session_store.decide.REFUSING_CLOSE_CODES): the next handshake is fresh. `fails_every_time`:
    a 1011 before setupComplete says nothing about the handle, so it is tried again
    (HANDLE_ATTEMPTS in all) before it is passed over, and the service is not given up."""
    call_id = f"review-refused-handle-{refusal}"
    # The dead worker's log: session 1 up, a handle issued, then a call whose tool ran and
    # whose result was never sent (the worker died right after logging it).
    await store.append(call_id, [
        ev.SessionOpened(MODEL, list(TOOLS), "dead-worker", 1,
                         {"model": MODEL, "system_instruction": PROMPT}),
        ev.Connected(1, None, "x"),
        ev.ConversationMessage("user", "Hello", 1),
        ev.HandleIssued(1, REFUSED, None),
        ev.ToolCallRequested("c1", "lookup_order", {"id": 1}, 1),
        ev.ToolCallStarted("c1", 1, f"{call_id}:c1", 1),
        ev.ToolCallCompleted("c1", {"ok": True, "order": 1}),
    ], 0, epoch=1, recorded_at_us=now_us())

    def script_for(record):
        # A server that no longer knows the handle refuses it, every time it is asked for.
        if record.resumption_handle == REFUSED:
            return (Script.refusing_handle() if refusal == "refused"
                    else Script(refuse_setup=1011))
        return Script()

    async with LocalLiveServer(script_for) as server:
        await _run_service(store, server, call_id, seconds=15,
                           until=lambda: any(r.id == "c1" for r in server.tool_responses()))
        asked = [c.resumption_handle for c in server.connections]
        delivered = [r for r in server.tool_responses() if r.id == "c1"]

    state = await load_state(store, call_id, use_snapshot=False)
    given_up = [r for r in await store.read(call_id)
                if r.type == "anomaly.recorded" and r.data["kind"] == "connection_given_up"]
    tries = 1 if refusal == "refused" else HANDLE_ATTEMPTS
    assert asked[:tries + 1] == [REFUSED] * tries + [None], (
        f"after the server refused {REFUSED!r} ({refusal}), the next handshake must be fresh "
        f"(the log chooses no handle once the newest is bad); handles asked for: {asked}")
    assert not given_up, f"the service was given up: {given_up[0].data}"
    assert len(delivered) == 1 and not undelivered(state), (
        f"c1's result never reached the model: {delivered}")


async def _run_service(store, server, call_id, *, seconds, until=None, before_setup=None):
    """Run the durable service on `call_id` against `server` for `seconds`, or until `until()`
    holds (then 0.3 s more), with no app frames. Returns the service and, per connection,
    (index, resumption handle, still open) as they were at the end."""
    ledger, tap = TimedLedger(), Tap()
    llm = DurableGeminiLiveLLMService(
        api_key="local-test-key",
        settings=GeminiLiveLLMService.Settings(model=MODEL, system_instruction=PROMPT),
        tools=tools_schema(list(TOOLS)), http_options=server.http_options(),
        store=store, call_id=call_id, worker_id="new-worker")
    for name in TOOLS:
        llm.register_function(name, make_tool(name, ledger, 0.01))
    if before_setup is not None:
        before_setup(llm)
    context = LLMContext(messages=[{"role": "user", "content": "Hello"}])
    aggregators = LLMContextAggregatorPair(context)
    task = PipelineWorker(Pipeline([aggregators.user(), llm, PlaybackOutput(), tap,
                                  aggregators.assistant()]),
                        params=PipelineParams(), cancel_on_idle_timeout=False)
    run = asyncio.create_task(run_worker(task))
    states = []
    try:
        await task.queue_frames([LLMRunFrame()])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until is not None and until()):
            await asyncio.sleep(0.05)
        if until is not None:
            await asyncio.sleep(0.3)
        states = [(c.index, c.resumption_handle, c.is_open) for c in server.connections]
    finally:
        await task.queue_frame(EndFrame())
        done, _ = await asyncio.wait({run}, timeout=3)
        if not done:
            await task.cancel()
            await asyncio.gather(run, return_exceptions=True)
    return llm, states


@pytest.mark.timeout(60)
async def test_a_worker_fenced_at_its_first_connected_closes_that_session(store):
    """Two workers take one call over at once (two supervisors, a slow one): B attaches with
    epoch 2, C with epoch 3 right after. B learns it is fenced only when it logs its
    session's `connection.connected`, before upstream makes that session `self._session`:
    B must close it itself (it left it open, its receive loop feeding B's pipeline)."""
    call_id = "review-double-takeover"
    now = now_us()
    await store.append(call_id, [
        ev.SessionOpened(MODEL, list(TOOLS), "dead-worker", 1,
                         {"model": MODEL, "system_instruction": PROMPT}),
        ev.Connected(1, None, "x"),
        ev.ConversationMessage("user", "Hello", 1),
    ], 0, epoch=1, recorded_at_us=now)

    def newer_worker_attaches_right_after(llm):
        real_attach = llm._driver.attach

        async def attach(**kwargs):
            state = await real_attach(**kwargs)
            from service.driver import CallDriver
            other = CallDriver(store, call_id, worker_id="newest-worker")
            await other.attach(**kwargs)  # epoch 3: B is fenced from here on
            return state

        llm._driver.attach = attach

    async with LocalLiveServer(Script()) as server:
        llm, connections = await _run_service(store, server, call_id, seconds=2.0,
                                              before_setup=newer_worker_attaches_right_after)
    assert llm.driver.fenced, "B should have found out it is fenced (its Connected append)"
    assert connections, "B never connected"
    still_open = [c for c in connections if c[2]]
    assert not still_open, (
        f"the fenced worker left its Gemini session(s) open: {still_open} "
        "(index, handle, open)")
