"""A send intent committed for one session is never carried out on another.

`EffectRunner.deliver` sends results whose ToolResultSending was just committed. If the session was
replaced in between (a reconnect got in), the intent names a generation that is gone:
sending it on the new session would answer, as a toolResponse, an id that session never
issued (Gemini ignores it and stays silent), or put a result into the model twice (the
delivery rules resend it anyway: its generation is not in the new session's lineage).
Found by mutation testing: dropping the generation check in `deliver` left every other
test green (the window is narrow on the wire: a reconnect mid-batch usually cancels the
task that delivers), so the guard is driven directly here, on a live call."""

from __future__ import annotations

import pytest

from service.local_live import Audio, Call, Close, Script, Sleep, ToolCall, TurnComplete
from session_store import events as ev

from .helpers import (BLOCKING_CALLS, Ctl, assert_ran_once, assert_server_clean, content_via,
                      resumes_past_a_call, run_call)

pytestmark = pytest.mark.timeout(90)


@BLOCKING_CALLS
@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_an_intent_for_a_replaced_session_is_not_sent_on_the_new_one(flavour):
    scripts = [
        Script([Audio(chunks=2), TurnComplete(), ToolCall(Call("c1", "lookup_order", {"id": 1})),
                Sleep(1.0), Close(1011, "internal error")], reply=()),
        Script([Sleep(4.0)], reply=()),
    ]
    outcome = {}

    async def drive(ctl: Ctl):
        llm = ctl.llm
        # c1 answered on the first session; then the session is replaced (on 2.5 resumed from
        # a handle older than c1, told the result once more as content; from 3.1 on a fresh
        # session whose seed holds it).
        await ctl.wait(lambda: len(ctl.server.connections) == 2 and llm._session is not None
                       and llm._driver.state.generation == 2 and not llm.session_link.busy,
                       timeout=10)
        await ctl.settle(0.3)
        # An intent committed for generation 1 reaches `deliver` only now.
        async with llm.effects.due_lock:
            outcome["acted"] = await llm.effects.deliver([ev.ToolResultSending("c1", 1,
                                                                        "tool_response")])
        await ctl.settle(0.5)

    run = await run_call(flavour, scripts, drive, timeout=30)

    assert run.state.generation == 2, run.timeline()
    assert outcome == {"acted": False}, outcome
    assert_server_clean(run)
    resumed = resumes_past_a_call(run)
    assert [(r.connection, r.via) for r in run.results("c1")] == [
        (0, "tool_response"), (1, content_via(run) if resumed else "content")]
    assert_ran_once(run, "c1")
    assert [(e.data["generation"], e.data["via"])
            for e in run.find("tool.result_sent", call_id="c1")] == [
                (1, "tool_response"), (2, content_via(run, logged=True) if resumed else "seed")]
