"""Races with the log's commits and pipecat's tool runners, on the real pipeline, the real
google-genai client and the local Gemini Live server (tests/service/helpers.py): a
cancellation while a call's start commits, a cancellation of a call queued behind another, a
cancellation by the app while a result commits, a prompt change while the first session's
handshake runs. Durable flavours only (some tests slow a commit to open the window)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pipecat.frames.frames import LLMUpdateSettingsFrame
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.local_live import (Audio, Call, CancelToolCalls, Script, Sleep, ToolCall,
                                TurnComplete, WaitToolResponse)

from .helpers import (PROMPT_RECONNECTS, Ctl, run_call)

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_cancellation_during_the_start_commit_stops_the_call(flavour):
    """c1 is deferred while the bot speaks. The bot stops: the notes task stages
    tool.call_started for c1 and awaits its commit (slowed here to 1.5 s to open the window;
    on a real database it is the ~1 ms of any commit, or a whole outage). Gemini's
    toolCallCancellation(c1) arrives meanwhile: the receive loop sees c1 as started (staged),
    finds no task to stop yet, and can only note the cancellation (the log is busy with the
    start). Until 2026-12-02 the tool then started when the commit returned and ran in full,
    after Gemini cancelled it; now the start is an intent in the log never carried out."""
    store = flavour.store
    real_append = store.append

    async def slow_start_append(stream_id, events, *args, **kwargs):
        if any(type(e).__name__ == "ToolCallStarted" for e in events):
            await asyncio.sleep(1.5)
        return await real_append(stream_id, events, *args, **kwargs)

    store.append = slow_start_append
    scripts = [Script([Audio(chunks=10), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=2),
                       TurnComplete(), Sleep(0.9), CancelToolCalls("c1"), Sleep(2.5),
                       Audio(chunks=2), TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0), timeout=10)
        await ctl.settle(0.5)

    try:
        run = await run_call(flavour, scripts, drive, tool_delay=0.3)
    finally:
        store.append = real_append

    cancelled_at = next(s.at for s in run.connections[0].sent
                        if isinstance(s.message, dict) and "toolCallCancellation" in s.message)
    late = [r for r in run.runs("c1") if r["t"] > cancelled_at]
    assert not late, (
        f"c1 started {late[0]['t'] - cancelled_at:.2f}s after Gemini cancelled it and ran to "
        f"the end; log:\n{run.timeline()}")
    assert run.runs("c1") == [] and run.results("c1") == []
    # The window was hit: the start was committed, then the cancellation.
    assert run.at("tool.call_started", call_id="c1") <= run.at("tool.call_cancelled",
                                                              call_id="c1"), run.timeline()
    assert run.state.calls["c1"].status == "cancelled"


@PROMPT_RECONNECTS
@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_prompt_changed_during_the_first_handshake_reaches_a_session(flavour):
    """The first session's handshake is slow (setupComplete 1.5 s after setup). The app
    changes the prompt meanwhile (an LLMUpdateSettingsFrame at the start of the call): the
    setup already on the wire carries the old prompt. The reconnect asked for during the
    handshake stays pending past the first connection.connected (at first it did only for
    later handshakes: no session ever got the new prompt)."""
    scripts = [Script([Audio(chunks=2), TurnComplete()], setup_delay=1.5, reply=()),
               Script([Audio(chunks=2), TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: len(ctl.server.connections) >= 1, timeout=5)
        await ctl.settle(0.2)  # the setup (old prompt) is on the wire; setupComplete is not
        ctl.mark("settings")
        await ctl.task.queue_frame(LLMUpdateSettingsFrame(
            delta=GeminiLiveLLMService.Settings(system_instruction="NEW")))
        await ctl.wait(lambda: any(c.system_instruction == "NEW"
                                   for c in ctl.server.connections), timeout=8)
        await ctl.settle(0.3)

    run = await run_call(flavour, scripts, drive)

    assert run.connections[0].system_instruction == "Be brief."
    assert run.find("connection.reconnect_requested", reason="settings"), run.timeline()
    prompts = [c.system_instruction for c in run.connections]
    assert "NEW" in prompts, (
        f"the prompt changed during the first handshake never reached a session "
        f"(sessions' prompts: {prompts}); log:\n{run.timeline()}")


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_queued_call_cancelled_by_gemini_never_runs_sequential(flavour):
    """run_in_parallel=False (a pipecat option the service passes through): c1 and c2 come
    in one toolCall, both starts are committed and both handed to pipecat, which queues c2
    behind c1 (its task does not exist yet). Gemini cancels c2 while c1 runs. The receive
    loop's _cancel_function_calls_by_tool_call_id finds no task for c2. When c1 ends,
    pipecat's sequential runner reaches c2: it must not run (DESIGN: a cancelled call that
    has not started never runs); it ran in full until `_run_function_call` checked."""
    scripts = [Script([ToolCall([Call("c1", ORDER, {"id": 1}), Call("c2", ORDER, {"id": 2})]),
                       Sleep(0.4), CancelToolCalls("c2"), Sleep(2.5), Audio(chunks=2),
                       TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0), timeout=10)
        await ctl.settle(0.5)

    run = await run_call(flavour, scripts, drive, tool_delay=1.2, run_in_parallel=False)

    cancelled_at = next(s.at for s in run.connections[0].sent
                        if isinstance(s.message, dict) and "toolCallCancellation" in s.message)
    assert run.state.calls["c2"].status == "cancelled", run.timeline()
    late = [r for r in run.runs("c2") if r["t"] > cancelled_at]
    assert not late, (
        f"c2 started {late[0]['t'] - cancelled_at:.2f}s after Gemini cancelled it (it was "
        f"only queued behind c1 then); log:\n{run.timeline()}")


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_call_the_app_cancels_while_its_result_commits_is_still_answered(flavour):
    """c1 finishes and its result callback runs in c1's own pipecat task: the service stages
    tool.call_completed and awaits its commit (slowed here to 1 s to open the window; on a
    real database any commit, or an outage). The app calls pipecat's cancel_function_calls()
    meanwhile, cancelling the task mid-append. The tool ran: its result is kept (noted) and
    delivered. (It went down with the task, and the cancellation's handler, reading the
    staged completion of a stale state, owed nothing: c1 stayed 'started' for good.)"""
    store = flavour.store
    real_append = store.append
    committing = asyncio.Event()

    async def slow_result_append(stream_id, events, *args, **kwargs):
        if any(type(e).__name__ == "ToolCallCompleted" for e in events):
            committing.set()
            await asyncio.sleep(1.0)
        return await real_append(stream_id, events, *args, **kwargs)

    store.append = slow_result_append
    scripts = [Script([ToolCall(Call("c1", ORDER, {"id": 1})),
                       WaitToolResponse("c1", timeout=6, required=False), Audio(chunks=2),
                       TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        await asyncio.wait_for(committing.wait(), 8)
        await ctl.settle(0.2)
        await ctl.llm.cancel_function_calls()
        store.append = real_append
        await ctl.wait(lambda: ctl.results("c1") or ctl.script_done(0), timeout=8)
        await ctl.settle(0.5)

    try:
        run = await run_call(flavour, scripts, drive, tool_delay=0.2)
    finally:
        store.append = real_append

    call = run.state.calls["c1"]
    assert call.status == "completed", (
        f"c1 is {call.status!r}, not completed with the result its tool produced; log:\n"
        f"{run.timeline()}")
    [result] = run.results("c1")
    assert '"ok": true' in json.dumps(result.response), result  # the tool's own result
