"""Speech bookkeeping across a reconnect that cuts a turn."""

from __future__ import annotations

import pytest

from service.local_live import (Audio, Call, Close, Script, Sleep, ToolCall, TurnComplete,
                                WaitFor, WaitToolResponse)

from .helpers import Ctl, assert_answered_once, assert_log_settled, assert_ran_once, run_call

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"


@pytest.mark.stock_bug("runs a tool call at once, while the bot is still speaking")
async def test_a_turn_cut_by_a_reconnect_does_not_hold_later_deferred_calls(flavour):
    """The session closes mid-turn (pipecat sends no TTSStoppedFrame for that turn), and
    the resumed session's first turn is queued behind its audio: the output transport plays
    both as one stretch and reports one stop. Counted as two turns, that stop and every
    later one (always one turn short) were not taken as silence: a call deferred in any
    later turn waited for the silence watchdog (speaking_timeout_s) instead of the end of
    the bot's speech."""
    scripts = [
        Script([WaitFor("client_content"), Audio(chunks=2), TurnComplete(), Audio(chunks=40),
                Close(1011, "internal error")], reply=()),
        Script([Audio(chunks=10), TurnComplete(), Sleep(3.0),
                Audio(chunks=10), ToolCall(Call("c2", ORDER, {"id": 2})), Audio(chunks=10),
                TurnComplete(), WaitToolResponse("c2", timeout=8), Audio(chunks=2),
                TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=15)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive)

    second = run.connections[1]
    issued_at = next(s.at for s in second.sent if "toolCall" in s.message)
    ran = assert_ran_once(run, "c2")
    stop = run.tap.first_stop_after(issued_at)
    assert stop is not None and ran["t"] >= stop, "the deferred call ran mid-speech"
    assert ran["t"] - stop < 1.0, (
        f"the deferred call started {ran['t'] - stop:.2f}s after the bot stopped speaking")
    assert_answered_once(run, "c2", ORDER, via="tool_response", connection=1)
    if flavour.durable:
        assert_log_settled(run)
