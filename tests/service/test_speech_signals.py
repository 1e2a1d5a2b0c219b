"""The bot's speaking state from its other sources: the model's turnComplete
(`speaking_signal="model"`) and the silence watchdog (`speaking_timeout_s`).

The wire scenarios run with the output transport's BotStarted/StoppedSpeakingFrame, which
always ends a stretch of speech; these two sources are what a pipeline without one (or a
turn with no audio for the transport to play) relies on."""

from __future__ import annotations

import pytest
from pipecat.frames.frames import LLMUpdateSettingsFrame
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.local_live import (Audio, Call, OutputTranscript, Script, ToolCall, TurnComplete,
                                WaitSignal, WaitToolResponse)

from .helpers import (BLOCKING_CALLS, PROMPT_RECONNECTS, Ctl, assert_answered_once,
                      assert_log_settled, assert_ran_once, assert_server_clean, run_call)

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)]

ORDER = "lookup_order"


def _stop_before_start(run, call_id: str):
    """The speech.bot_stopped that let the call start (the last one before its start)."""
    started = run.at("tool.call_started", call_id=call_id)
    stops = [e for e in run.find("speech.bot_stopped") if e.version < started]
    assert stops, f"{call_id} started with no stop of speech before it:\n{run.timeline()}"
    return stops[-1]


@BLOCKING_CALLS
async def test_model_signal_ends_speech_at_turn_complete(flavour):
    """speaking_signal="model": the bot speaks until the model's turnComplete. A call
    deferred mid-turn starts on that turnComplete, not on the transport's stop (2 s of audio
    later here) nor on the watchdog (its timeout is longer than the whole call). The
    transport's frames are not counted at all: its start, when it came after the
    turnComplete (seen under load in CI), began the speech again and held the call until
    playback ended, so the outcome depended on frame timing."""
    scripts = [Script([Audio(chunks=10), ToolCall(Call("c1", ORDER, {"id": 1})),
                       Audio(chunks=40), TurnComplete(), WaitToolResponse("c1", timeout=8),
                       Audio(chunks=2), TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=25)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, speaking_signal="model",
                         speaking_timeout_s=60.0)

    assert_ran_once(run, "c1")
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    assert_server_clean(run)
    assert run.at("tool.call_deferred", call_id="c1") < run.at("tool.call_started", call_id="c1")
    stop = _stop_before_start(run, "c1")
    assert stop.data["source"] == "turn_complete", run.timeline()
    from_transport = [e for e in run.find("speech.bot_started") + run.find("speech.bot_stopped")
                      if e.data["source"] == "transport"]
    assert not from_transport, run.timeline()
    assert_log_settled(run)


@BLOCKING_CALLS
async def test_watchdog_ends_speech_no_transport_ever_reported(flavour):
    """A turn with no audio (output transcription only, as Vertex sends ahead of the audio, or
    a text turn) makes the model "respond", but the transport never plays anything, so it
    never reports a stop; and the server holds turnComplete until it has the tool response
    (Gemini 3.x). Only the silence watchdog (speaking_timeout_s) ends that speech: without
    it the deferred call never starts and the model waits for ever."""
    scripts = [Script([OutputTranscript("Let me check that order."),
                       ToolCall(Call("c1", ORDER, {"id": 1})),
                       WaitToolResponse("c1", timeout=10), Audio(chunks=2), TurnComplete()],
                      reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=25)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, speaking_timeout_s=1.0)

    assert_ran_once(run, "c1")
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    assert_server_clean(run)
    assert run.at("tool.call_deferred", call_id="c1") < run.at("tool.call_started", call_id="c1")
    stop = _stop_before_start(run, "c1")
    assert stop.data["source"] == "timeout", run.timeline()
    assert_log_settled(run)


@PROMPT_RECONNECTS
async def test_model_signal_prompt_change_mid_turn_delivers_on_the_new_session(flavour):
    """speaking_signal="model", a prompt change while the model speaks (P2): the reconnect
    is due at the turnComplete (P3), while the transport still plays the turn. The new
    session noted the transport's playback as speech, as transport mode must; in "model"
    mode the transport's stop is not counted, so that speech lasted until the watchdog
    (4 s by default, 60 here) and the deferred call's result waited for it, unsent. Now:
    one reconnect, the new prompt on the new session, the result delivered there at once,
    and no transport-sourced speech in the log."""
    scripts = [
        # The turn's end waits for the test: the change must come while the model speaks.
        Script([Audio(chunks=15), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=10),
                WaitSignal("go"), TurnComplete(),
                WaitToolResponse("c1", timeout=3, required=False)], reply=()),
        Script([WaitToolResponse("c1"), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        def state():
            return ctl.llm.driver.state

        await ctl.wait(lambda: "c1" in state().calls and state().bot_speaking, timeout=5)
        await ctl.task.queue_frame(LLMUpdateSettingsFrame(
            delta=GeminiLiveLLMService.Settings(system_instruction="NEW")))
        await ctl.wait(lambda: state().reconnect_pending is not None, timeout=5)
        assert state().bot_speaking and state().generation == 1, "the change came mid-turn"
        ctl.server.signal("go")
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, speaking_signal="model",
                         speaking_timeout_s=60.0)

    assert [c.system_instruction for c in run.connections] == ["Be brief.", "NEW"], \
        run.timeline()
    assert run.connections[0].closed_by == "client"
    disconnects = [e.data["reason"] for e in run.find("connection.disconnected")]
    assert disconnects == ["settings", "shutdown"], run.timeline()
    assert not run.find("connection.reconnect_requested", reason="error"), run.timeline()
    assert_ran_once(run, "c1")
    assert_answered_once(run, "c1", ORDER, connection=1)
    assert_server_clean(run)
    stop = _stop_before_start(run, "c1")
    assert stop.data["source"] == "turn_complete", run.timeline()
    assert not [e for e in run.find("speech.bot_started") if e.data["source"] == "transport"], \
        run.timeline()
    assert_log_settled(run)
