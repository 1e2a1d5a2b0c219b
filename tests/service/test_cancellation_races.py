"""A cancellation racing the commit of a call's start, on the real pipeline, the real
google-genai client and the local Gemini Live server (tests/service/helpers.py). Durable
flavours only: the test slows the log's commit of the start to open the window."""

from __future__ import annotations

import asyncio

import pytest

from service.local_live import Audio, Call, CancelToolCalls, Script, Sleep, ToolCall, TurnComplete

from .helpers import Ctl, run_call

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_cancellation_during_the_start_commit_stops_the_call(flavour):
    """c1 is deferred while the bot speaks. The bot stops: the notes task stages
    tool.call_started for c1 and awaits its commit (slowed here to 1.5 s to open the window;
    on a real database it is the ~1 ms of any commit, or a whole outage). Gemini's
    toolCallCancellation(c1) arrives meanwhile: the receive loop sees c1 as started (staged),
    finds no task to stop yet, and can only note the cancellation (the log is busy with the
    start). Until stop 17 the tool then started when the commit returned and ran in full,
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
