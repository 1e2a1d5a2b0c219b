"""Speech bookkeeping across a reconnect that cuts a turn."""

from __future__ import annotations

import asyncio

import pytest
from pipecat.services.llm_service import FunctionCallParams

from service.local_live import (Audio, Call, Close, GoAway, Script, Sleep, ToolCall,
                                TurnComplete, WaitFor, WaitSignal, WaitToolResponse)
from session_store import Policy
from session_store.audit import replay

from .helpers import (BLOCKING_CALLS, Ctl, assert_answered_once, assert_log_settled,
                      assert_ran_once, assert_server_clean, content_via,
                      resumes_past_a_call, run_call)

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"
WEATHER = "get_weather"
#: The old session's audio in the handshake test: 2 + 5 + 5 + 65 chunks of 40 ms.
OLD_AUDIO_S = 77 * 0.04


@BLOCKING_CALLS
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


@BLOCKING_CALLS
@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_deferred_call_waits_for_the_old_audio_through_the_reconnect_handshake(flavour):
    """A goAway forces a reconnect mid-turn, while the output transport still plays the
    old session's audio with a call deferred in it. The projection takes the disconnect as
    the end of speech, so the service logs that the transport still speaks with it: a
    result that comes in during the (slow) handshake makes the service perform what is due
    right then, and the deferred call must not start in that gap, mid-playback."""
    handshaking = asyncio.Event()
    scripts = [
        Script([WaitSignal("go"), Audio(chunks=2), TurnComplete(),
                # c0 is never deferred (Policy below): it runs at once and answers only once
                # the next session's handshake is under way.
                ToolCall(Call("c0", WEATHER, {"id": 0})), Audio(chunks=5),
                GoAway(time_left=2.0), Audio(chunks=5), ToolCall(Call("c1", ORDER, {"id": 1})),
                Audio(chunks=65), TurnComplete()], reply=()),
        Script([WaitToolResponse(["c0", "c1"], timeout=8), Audio(chunks=2), TurnComplete()],
               setup_delay=1.0, reply=()),
    ]

    async def drive(ctl: Ctl):
        async def answers_during_the_handshake(params: FunctionCallParams) -> None:
            ctl.ledger.write({"tool": WEATHER, "call_id": params.tool_call_id,
                              "args": params.arguments})
            await ctl.wait(lambda: len(ctl.server.connections) >= 2, timeout=8)
            handshaking.set()
            await params.result_callback({"ok": True, "tool": WEATHER})

        ctl.llm.register_function(WEATHER, answers_during_the_handshake)
        ctl.server.signal("go")
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=15)
        await ctl.settle()

    policy = Policy(defer=frozenset({ORDER}), go_away_margin_s=1.0)
    run = await run_call(flavour, scripts, drive, policy=policy)

    assert handshaking.is_set()
    assert len(run.connections) == 2
    # The test's premise: c0's result was logged while the next session's handshake ran.
    assert (run.at("connection.disconnected", generation=1)
            < run.at("tool.call_completed", call_id="c0")
            < run.at("connection.connected", generation=2)), run.timeline()
    ran = assert_ran_once(run, "c1")
    assert not run.tap.speaking_at(ran["t"]), (
        f"the deferred call ran at {ran['t']:.3f}, while the old session's audio still "
        f"played: {run.tap.intervals()}\n{run.timeline()}")
    issued_at = next(s.at for s in run.connections[0].sent if "c1" in str(s.message))
    stop = run.tap.first_stop_after(issued_at)
    assert stop is not None and ran["t"] >= stop
    # (From 3.1 on the new session is fresh: c0's result, logged by then, is in its seed.)
    answered = assert_answered_once(
        run, "c0", WEATHER, via=content_via(run) if resumes_past_a_call(run) else "content",
        connection=1)
    if not resumes_past_a_call(run):
        # From 3.1 on the new session is fresh, and its seed (c0's result in it) goes in at
        # connect, while the old session's audio still plays. Content into a live session
        # waits for that audio because it cuts the session's generation under way; a fresh
        # session has none to cut, and its answer plays after the old audio (one output
        # transport, in order). What must hold: the old audio plays to its end.
        assert run.tap.speaking_at(answered.at), run.tap.intervals()  # (the premise)
        first_start = run.tap.intervals()[0][0]
        stop = run.tap.first_stop_after(answered.at)
        assert stop is not None and stop - first_start >= 0.9 * OLD_AUDIO_S, (
            f"the old session's audio ({OLD_AUDIO_S} s) was cut after "
            f"{(stop or 0) - first_start:.2f} s: {run.tap.intervals()}\n{run.timeline()}")
        assert not [r for r in run.events if r.type == "speech.interrupted"], run.timeline()
        assert_answered_once(run, "c1", ORDER, via=content_via(run), connection=1)
        assert_server_clean(run)
        assert_log_settled(run)
        assert replay(run.events, policy).ok
        return
    # Content cuts the model's generation under way: it too waits for the old audio to end.
    assert not run.tap.speaking_at(answered.at), (
        f"c0's result went in as content at {answered.at:.3f}, while the old session's "
        f"audio still played: {run.tap.intervals()}\n{run.timeline()}")
    assert_answered_once(run, "c1", ORDER, via=content_via(run), connection=1)
    assert_server_clean(run)
    assert_log_settled(run)
    report = replay(run.events, policy)  # every send in the log is one today's decisions make
    assert report.ok, [d.message for d in report.divergences]
