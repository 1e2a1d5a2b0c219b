"""When a result goes to the model as conversation content, on the wire.

Content interrupts the model's generation under way (google-genai's LiveClientContent: "a
message here will interrupt any current model generation"), so a result the session never
asked for (it goes in as content) waits for the bot to stop speaking, as a deferred call
does; a toolResponse the model waits for does not.
"""

from __future__ import annotations

import pytest

from service.local_live import (Audio, Call, Close, Script, Sleep, ToolCall, TurnComplete,
                                WaitFor, WaitToolResponse)
from session_store import Policy

from .helpers import (Ctl, assert_answered_once, assert_log_settled, assert_ran_once,
                      assert_server_clean, content_via, run_call)

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"
TOOL_S = 0.8


@pytest.mark.stock_bug("the result of a call whose session closed goes out as a toolResponse "
                       "the new session never issued")
async def test_a_result_as_content_waits_for_the_bot_to_stop_speaking(flavour):
    scripts = [
        # (It speaks once it has the opening seed: a session whose seed never arrived would
        # not be resumed from, rightly, and the test is about a resumed one.)
        Script([WaitFor("client_content"), Audio(chunks=2), TurnComplete(),
                ToolCall(Call("c1", ORDER, {"id": 1})), Sleep(0.2),
                Close(1011, "internal error")], reply=()),
        # The resumed session talks for 1.2 s at once; the tool finishes meanwhile.
        Script([Audio(chunks=30), TurnComplete(), WaitToolResponse("c1", timeout=6),
                Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=12)
        await ctl.settle()

    # defer="none": the tool starts at its toolCall and is done while the resumed session
    # talks, however close the two sessions' playback runs (deferred, it would wait out any
    # speech, I4); the rule under test does not depend on the defer policy.
    run = await run_call(flavour, scripts, drive, tool_delay=TOOL_S, policy=Policy(defer="none"))

    assert len(run.connections) == 2
    assert_server_clean(run)
    result = assert_answered_once(run, "c1", ORDER, via=content_via(run), connection=1)
    ran = assert_ran_once(run, "c1")
    talk_from = run.connections[1].sent[1].at  # (sent[0] is setupComplete)
    stop = run.tap.first_stop_after(talk_from)
    assert stop is not None, "the bot never stopped speaking"
    assert ran["t"] + TOOL_S < stop, (
        "the tool did not finish while the bot spoke: the test proves nothing")
    assert result.at >= stop, (
        f"the result went in as content {stop - result.at:.2f}s before the bot stopped "
        "speaking: it cut the model's turn")
    if flavour.durable:
        assert_log_settled(run)
