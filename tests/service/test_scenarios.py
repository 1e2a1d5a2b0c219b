"""Wire scenarios: the real pipecat pipeline, the real google-genai client, the local server.

Each scenario runs three times (the `flavour` fixture): our DurableGeminiLiveLLMService on
SQLite and on PostgreSQL, and pipecat's stock GeminiLiveLLMService. Our runs assert on the
server's record of every connection, on the tool ledger and on the call's event log; the
stock run asserts on the server and the ledger only, and where stock pipecat misbehaves it
is a strict xfail naming the upstream bug.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from pipecat.frames.frames import InterruptionFrame, LLMUpdateSettingsFrame
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService
from pipecat.services.llm_service import FunctionCallParams

from service.local_live import (Audio, Call, CancelToolCalls, Close, GoAway, Interrupted, Script,
                                Sleep, ToolCall, TurnComplete, WaitSignal, WaitToolResponse)
from session_store import Policy

from .helpers import (BLOCKING_CALLS, PROMPT_RECONNECTS, Ctl, assert_answered_once,
                      assert_cancelled_after_start, assert_chain_ok, assert_log_settled,
                      assert_no_fallback_names, assert_ran_once, assert_server_clean,
                      content_via, handles_of, resumes_past_a_call, run_call)

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"
WEATHER = "get_weather"


# --------------------------------------------------------------------------- deferral (P1)

@BLOCKING_CALLS
@pytest.mark.stock_bug("runs a tool call at once, while the bot is still speaking")
async def test_tool_call_while_bot_speaks_is_deferred_then_run_and_answered_once(flavour):
    scripts = [Script([Audio(chunks=10), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=10),
                       TurnComplete(), WaitToolResponse("c1"), Audio(chunks=2), TurnComplete()],
                      reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive)

    assert_server_clean(run)
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    ran = assert_ran_once(run, "c1")
    # I4: the tool started only once the output transport said the bot stopped speaking.
    issued_at = run.connections[0].sent[10].at  # the toolCall, after 10 audio chunks
    assert not run.tap.speaking_at(ran["t"]), (
        f"tool started at {ran['t']:.3f} while the bot spoke: {run.tap.intervals()}")
    stop = run.tap.first_stop_after(issued_at)
    assert stop is not None and ran["t"] >= stop
    assert len(run.connections) == 1

    if flavour.durable:
        started = run.at("tool.call_started", call_id="c1")
        stopped = max(e.version for e in run.find("speech.bot_stopped") if e.version < started)
        assert (run.at("tool.call_requested", call_id="c1") < run.at("tool.call_deferred", call_id="c1")
                < stopped < started < run.at("tool.call_completed", call_id="c1")
                < run.at("tool.result_sending", call_id="c1") < run.at("tool.result_sent", call_id="c1"))
        bot_stopped_at = run.events[stopped - 1].recorded_at_us / 1e6
        assert ran["t"] >= bot_stopped_at, "the tool ran before the log said the bot stopped"
        assert run.state.calls["c1"].status == "completed"
        assert_log_settled(run)
        await assert_chain_ok(run)


@BLOCKING_CALLS
@pytest.mark.stock_bug("runs a tool call at once, while the bot is still speaking")
async def test_audio_faster_than_real_time_keeps_the_call_deferred_until_playback_ends(flavour):
    """Gemini streams audio faster than it plays. The service's silence watchdog (for
    pipelines whose transport never reports speech) must not declare the bot silent while
    the output transport is still playing what it was given."""
    scripts = [Script([Audio(chunks=60), ToolCall(Call("c1", ORDER, {"id": 1})), TurnComplete(),
                       WaitToolResponse("c1", timeout=5), Audio(chunks=2), TurnComplete()],
                      reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=8)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, speaking_timeout_s=1.0)

    issued_at = run.connections[0].sent[60].at
    stop = run.tap.first_stop_after(issued_at)
    ran = assert_ran_once(run, "c1")
    assert stop is not None and ran["t"] >= stop, (
        f"tool ran {stop - ran['t']:.2f}s before the 2.4 s of audio finished playing")
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    assert_server_clean(run)
    if flavour.durable:
        started = run.at("tool.call_started", call_id="c1")
        stopped = [e for e in run.find("speech.bot_stopped") if e.version < started]
        assert stopped and stopped[-1].data["source"] == "transport", run.timeline()
        assert_log_settled(run)


@BLOCKING_CALLS
@pytest.mark.slow
@pytest.mark.stock_bug("runs a tool call at once, while the bot is still speaking")
async def test_turn_complete_held_until_the_tool_response_does_not_deadlock(flavour):
    """Gemini 3.x may hold turnComplete until it has the tool response: "speaking" then ends
    on the output transport's own silence fallback, and the deferred call runs."""
    scripts = [Script([Audio(chunks=10), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=5),
                       WaitToolResponse("c1", timeout=8), TurnComplete(), Audio(chunks=2),
                       TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive)

    issued_at = run.connections[0].sent[10].at
    stop = run.tap.first_stop_after(issued_at)
    ran = assert_ran_once(run, "c1")
    assert stop is not None and ran["t"] >= stop, "the tool ran mid-speech"
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    assert_server_clean(run)
    if flavour.durable:
        assert_log_settled(run)


# --------------------------------------------------------------------------- settings (P2, P3)

@PROMPT_RECONNECTS
@pytest.mark.stock_bug("a system_instruction update only logs a warning: no new session, "
                       "the new prompt never reaches Gemini")
async def test_prompt_change_mid_turn_reconnects_after_the_turn_with_the_new_prompt(flavour):
    scripts = [
        Script([Audio(chunks=15), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=10),
                TurnComplete(),
                # stock never reconnects: it answers here (our result goes to the new session)
                WaitToolResponse("c1", timeout=3, required=False), Audio(chunks=2),
                TurnComplete()], reply=()),
        Script([WaitToolResponse("c1"), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.tap.speaking, timeout=5)
        ctl.mark("settings")
        await ctl.task.queue_frame(LLMUpdateSettingsFrame(
            delta=GeminiLiveLLMService.Settings(system_instruction="NEW")))
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=5)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive)

    assert run.tap.speaking_at(run.marks["settings"]), "the change must arrive mid-turn"
    assert len(run.connections) == 2, "no new session for the new prompt"
    first, second = run.connections
    assert first.system_instruction == "Be brief."
    assert second.system_instruction == "NEW"
    # No cut: the old session was closed (by us) only after the bot stopped speaking.
    stop = run.tap.first_stop_after(run.marks["settings"])
    assert stop is not None and first.closed_at >= stop, "reconnected mid-turn"
    assert first.closed_by == "client"
    assert_server_clean(run)
    assert_no_fallback_names(run)
    assert_answered_once(run, "c1", ORDER, connection=1)
    ran = assert_ran_once(run, "c1")
    assert ran["t"] >= stop

    if flavour.durable:
        settings = run.at("settings.changed")
        assert run.find("settings.changed")[0].data["keys"] == ["system_instruction"]
        requested = run.at("connection.reconnect_requested", reason="settings")
        started = run.at("tool.call_started", call_id="c1")
        stopped = max(e.version for e in run.find("speech.bot_stopped") if e.version < started)
        disconnected = run.at("connection.disconnected", reason="settings")
        connected = run.at("connection.connected", generation=2)
        # I5: buffered while speaking, after the turn, after the deferred call started.
        assert (settings < requested < stopped < started < disconnected < connected), run.timeline()
        assert run.at("tool.call_deferred", call_id="c1") < stopped
        sent = run.find("tool.result_sent", call_id="c1")
        assert [e.data["generation"] for e in sent] == [2]
        assert_log_settled(run)
        await assert_chain_ok(run)


# --------------------------------------------------------------------------- reconnects (P4)

@pytest.mark.stock_bug("a result produced while no session is open is dropped "
                       "(_tool_result returns) and marked completed anyway")
async def test_result_produced_during_a_reconnect_is_delivered_once_on_the_new_session(flavour):
    scripts = [
        Script([Audio(chunks=2), TurnComplete(), ToolCall(Call("c1", ORDER, {"id": 1})),
                Sleep(0.3), Close(1011, "internal error")], reply=()),
        # A slow handshake: the tool finishes while no session is open.
        Script([WaitToolResponse("c1", timeout=2.5), Audio(chunks=2), TurnComplete()],
               setup_delay=1.0, reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, tool_delay=0.6)

    assert len(run.connections) == 2
    resumed = resumes_past_a_call(run)
    assert run.connections[1].resumption_handle == (
        handles_of(run.server, 0)[-1] if resumed else None)
    assert_server_clean(run)
    # The resumed state predates the call: it never issued c1, so the result goes in as
    # conversation content, with the function's own name (3.x: in the seed, or after it).
    assert_answered_once(run, "c1", ORDER, via=content_via(run) if resumed else None,
                         connection=1)
    assert_ran_once(run, "c1")

    if flavour.durable:
        completed = run.at("tool.call_completed", call_id="c1")
        assert run.at("connection.disconnected", generation=1) < completed < run.at(
            "connection.connected", generation=2), "the result was not produced mid-reconnect"
        assert [(e.data["generation"], e.data["via"])
                for e in run.find("tool.result_sent", call_id="c1")] in (
                    [[(2, content_via(run, logged=True))]] if resumed else
                    [[(2, "seed")], [(2, "text")]])
        assert_log_settled(run)
        await assert_chain_ok(run)


@BLOCKING_CALLS
@pytest.mark.stock_bug("the result of a call whose session closed is lost: dropped while "
                       "reconnecting, or sent as a toolResponse the new session never issued")
async def test_server_closes_1011_right_after_a_tool_call(flavour):
    scripts = [
        Script([Audio(chunks=2), TurnComplete(), ToolCall(Call("c1", ORDER, {"id": 1})),
                Close(1011, "internal error")], reply=()),
        Script([WaitToolResponse("c1", timeout=2.5), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=8)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive)

    assert len(run.connections) == 2
    assert run.connections[0].close_code == 1011
    resumed = resumes_past_a_call(run)
    newest = handles_of(run.server, 0)[-1] if resumed else None
    assert run.connections[1].resumption_handle == newest
    assert_server_clean(run)
    assert_no_fallback_names(run)
    assert_answered_once(run, "c1", ORDER, via=content_via(run) if resumed else None,
                         connection=1)
    assert_ran_once(run, "c1")

    if flavour.durable:
        assert run.find("connection.disconnected", generation=1)[0].data["reason"] == "error"
        assert run.find("connection.connected", generation=2)[0].data["handle"] == newest
        assert_log_settled(run)
        await assert_chain_ok(run)


@pytest.mark.stock_bug("goAway is ignored: no reconnect before the deadline, the server "
                       "closes the session on the call")
async def test_go_away_reconnects_before_the_deadline_with_the_newest_handle(flavour):
    scripts = [
        Script([ToolCall(Call("c1", ORDER, {"id": 1})), WaitToolResponse("c1"),
                Audio(chunks=3), TurnComplete(), Audio(chunks=2), TurnComplete(),
                Audio(chunks=10), GoAway(time_left=3.0, close_code=1000), Audio(chunks=5),
                TurnComplete()], reply=()),
        Script([Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=8)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, policy=Policy(go_away_margin_s=1.0))

    first = run.connections[0]
    go_away_at = next(s.at for s in first.sent if "goAway" in s.message)
    assert len(run.connections) == 2
    # We left before Gemini's deadline, and resumed from the newest handle it gave us.
    assert first.closed_by == "client", f"closed by {first.closed_by} ({first.close_code})"
    assert first.closed_at < go_away_at + 3.0
    assert run.connections[1].opened_at < go_away_at + 3.0
    newest = handles_of(run.server, 0)[-1]
    assert run.connections[1].resumption_handle == newest
    assert_server_clean(run)
    # The resumed state holds c1's answer: it is not sent again.
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    assert_ran_once(run, "c1")

    if flavour.durable:
        go_away = run.at("connection.go_away", generation=1)
        assert go_away < run.at("connection.disconnected", reason="go_away") < run.at(
            "connection.connected", generation=2, handle=newest)
        persisted = [e.data["handle"] for e in run.find("connection.handle_issued")]
        assert persisted == handles_of(run.server, 0) + handles_of(run.server, 1)
        assert_log_settled(run)
        await assert_chain_ok(run)


@BLOCKING_CALLS
@pytest.mark.stock_bug("goAway is ignored: the server closes the session at the deadline "
                       "(and the call runs at once, mid-speech)")
async def test_go_away_while_the_bot_keeps_speaking_reconnects_before_the_deadline(flavour):
    """When the turn outlasts goAway's time left minus the margin, the reconnect cannot wait
    for the turn boundary: it happens before the deadline anyway."""
    scripts = [
        Script([Audio(chunks=2), TurnComplete(), Audio(chunks=5), GoAway(time_left=2.0),
                Audio(chunks=5), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=65),
                TurnComplete()], reply=()),
        Script([WaitToolResponse("c1", timeout=5), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=8)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, policy=Policy(go_away_margin_s=1.0))

    first = run.connections[0]
    go_away_at = next(s.at for s in first.sent if "goAway" in s.message)
    assert len(run.connections) == 2
    assert first.closed_by == "client" and first.closed_at < go_away_at + 2.0
    assert first.closed_at >= go_away_at + 0.9, "left earlier than the margin asked"
    assert run.connections[1].resumption_handle == (
        handles_of(run.server, 0)[-1] if resumes_past_a_call(run) else None)
    assert_server_clean(run)
    # The call that came mid-speech waited for the old session's audio to finish playing,
    # across the reconnect, and went to the new session (which never issued it) as content.
    issued_at = next(s.at for s in first.sent if "toolCall" in s.message)
    ran = assert_ran_once(run, "c1")
    stop = run.tap.first_stop_after(issued_at)
    assert stop is not None and ran["t"] >= stop, "the deferred call ran mid-speech"
    # (The transport stops and starts again between the first turns: the stop above may be
    # that of a turn before the call's. The call's own turn plays on across the reconnect.)
    assert not run.tap.speaking_at(ran["t"]), (
        f"the deferred call ran at {ran['t']:.3f}, while the old session's audio still "
        f"played: {run.tap.intervals()}")
    assert ran["t"] > first.closed_at
    assert_answered_once(run, "c1", ORDER,
                         via=content_via(run) if resumes_past_a_call(run) else None,
                         connection=1)
    if flavour.durable:
        assert run.find("connection.disconnected", generation=1)[0].data["reason"] == "go_away"
        started = run.at("tool.call_started", call_id="c1")
        stopped = [e for e in run.find("speech.bot_stopped") if e.version < started]
        assert stopped and stopped[-1].data["source"] == "transport", run.timeline()
        assert_log_settled(run)


# --------------------------------------------------------------------------- cancellation

@BLOCKING_CALLS
@pytest.mark.stock_bug("toolCallCancellation is ignored (and the call ran at once, mid-speech): "
                       "the cancelled call runs and is answered")
async def test_cancellation_before_the_call_started_never_runs_never_answers(flavour):
    scripts = [Script([Audio(chunks=10), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=3),
                       CancelToolCalls("c1"), Audio(chunks=5), TurnComplete()],
                      reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and ctl.tap.speech
                       and not ctl.tap.speaking, timeout=6)
        await ctl.settle(0.6)

    run = await run_call(flavour, scripts, drive)

    assert run.runs("c1") == [], "a cancelled call ran"
    assert run.results("c1") == [], "a cancelled call was answered"
    assert_server_clean(run)

    if flavour.durable:
        assert run.at("tool.call_deferred", call_id="c1") < run.at("tool.call_cancelled",
                                                                   call_id="c1")
        assert not run.find("tool.call_started", call_id="c1")
        assert run.state.calls["c1"].status == "cancelled"
        assert_log_settled(run)
        await assert_chain_ok(run)


@pytest.mark.stock_bug("toolCallCancellation is ignored: the running call is answered anyway")
async def test_cancellation_after_the_call_started_is_not_answered(flavour):
    scripts = [Script([ToolCall(Call("c1", ORDER, {"id": 1})), Sleep(0.3), CancelToolCalls("c1"),
                       Sleep(1.0), Audio(chunks=2), TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and ctl.tap.speech
                       and not ctl.tap.speaking, timeout=6)
        await ctl.settle(0.3)

    run = await run_call(flavour, scripts, drive, tool_delay=0.8)

    await assert_cancelled_after_start(run, "c1")


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_cancellation_stops_the_running_tool(flavour):
    """Gemini's toolCallCancellation for a call that is running stops its task (pipecat
    cancels it): the tool's work after that point never happens, and no result comes."""
    finished: list[str] = []
    scripts = [Script([WaitSignal("go"), ToolCall(Call("c1", ORDER, {"id": 1})),
                       WaitSignal("started"), CancelToolCalls("c1"),
                       Audio(chunks=2), TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        started = asyncio.Event()

        async def slow_lookup(params: FunctionCallParams) -> None:
            ctl.ledger.write({"tool": ORDER, "call_id": params.tool_call_id,
                              "args": params.arguments})
            started.set()
            ctl.server.signal("started")  # Gemini cancels it now, while it runs
            await asyncio.sleep(3.0)
            finished.append(params.tool_call_id)
            await params.result_callback({"ok": True})

        ctl.llm.register_function(ORDER, slow_lookup)
        ctl.server.signal("go")
        await asyncio.wait_for(started.wait(), 8)
        await ctl.wait(lambda: ctl.script_done(0) and ctl.tap.speech and not ctl.tap.speaking,
                       timeout=6)
        # Long enough for the tool to have finished had it not been stopped.
        await ctl.wait(lambda: bool(finished), timeout=4.0)

    run = await run_call(flavour, scripts, drive)

    assert finished == [], "the cancelled call's tool ran to its end"
    await assert_cancelled_after_start(run, "c1")


@pytest.mark.stock_bug("a local interruption (the user's barge-in) cancels the running tool "
                       "and nothing answers Gemini, which never cancelled the call")
async def test_a_local_barge_in_does_not_leave_a_running_call_unanswered(flavour):
    """The bot is silent; Gemini asks for c1, which runs for 1.5 s. The user barges in: the
    pipeline's InterruptionFrame reaches the service. pipecat cancels every running call
    of a tool registered with cancel_on_interruption (the default) and answers none. Gemini
    decides what its interruption cancels (toolCallCancellation, tested above): here it
    cancelled nothing, so the call finishes and is answered, once."""
    scripts = [Script([Audio(chunks=3), TurnComplete(), ToolCall(Call("c1", ORDER, {"id": 1})),
                       WaitToolResponse("c1", timeout=6, required=False), Audio(chunks=2),
                       TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: ctl.ledger.runs, timeout=8), "c1 never started"
        await ctl.settle(0.2)
        await ctl.llm.queue_frame(InterruptionFrame())  # the user barges in
        await ctl.wait(lambda: ctl.results("c1") or ctl.script_done(0), timeout=9)
        await ctl.settle(0.5)

    run = await run_call(flavour, scripts, drive, tool_delay=1.5)

    assert_ran_once(run, "c1")
    result = assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    assert "error" not in json.dumps(result.response), result.response
    assert_server_clean(run)
    if flavour.durable:
        assert run.state.calls["c1"].status == "completed"
        assert_log_settled(run)


async def test_a_tool_past_its_timeout_is_answered_with_an_explicit_failure(flavour):
    """pipecat stops a call that runs past `function_call_timeout_secs` and pushes no
    result; the model still waits for one. Stock answers it from its context re-scan as
    "CANCELLED" (though the tool may have taken effect); ours, whose results leave only by
    the log, recorded nothing and the model waited for ever. Now the log records an
    explicit failure (outcome unknown: the tool was stopped half-way), delivered once."""
    scripts = [Script([ToolCall(Call("c1", ORDER, {"id": 1})),
                       WaitToolResponse("c1", timeout=6, required=False), Audio(chunks=2),
                       TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.results("c1") or ctl.script_done(0), timeout=9)
        await ctl.settle(0.5)

    run = await run_call(flavour, scripts, drive, tool_delay=3.0, function_call_timeout_secs=0.4)

    assert_ran_once(run, "c1")
    result = assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    assert_server_clean(run)
    if flavour.durable:
        assert "outcome_unknown" in json.dumps(result.response), result.response
        call = run.state.calls["c1"]
        assert (call.status, call.outcome_unknown) == ("failed", True), run.timeline()
        assert_log_settled(run)


# --------------------------------------------------------------------------- speech

@BLOCKING_CALLS
@pytest.mark.stock_bug("runs the tool at once, mid-speech, instead of when the interruption "
                       "ends the bot's turn")
async def test_interruption_ends_speech_and_starts_the_deferred_call(flavour):
    scripts = [Script([Audio(chunks=30), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=5),
                       Sleep(0.4), Interrupted(), WaitToolResponse("c1"), Audio(chunks=2),
                       TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=8)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive)

    first = run.connections[0]
    interrupted_at = next(s.at for s in first.sent
                          if s.message.get("serverContent", {}).get("interrupted"))
    ran = assert_ran_once(run, "c1")
    assert ran["t"] >= interrupted_at, "the tool ran before the interruption, mid-speech"
    # ... and the interruption, not the end of the 1.4 s of audio, let it start.
    assert ran["t"] < first.sent[0].at + 1.3
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    assert_server_clean(run)

    if flavour.durable:
        assert (run.at("tool.call_deferred", call_id="c1") < run.at("speech.interrupted")
                < run.at("tool.call_started", call_id="c1"))
        assert_log_settled(run)
        await assert_chain_ok(run)


@BLOCKING_CALLS
@pytest.mark.stock_bug("runs parallel tool calls at once, while the bot is still speaking")
async def test_parallel_calls_in_one_tool_call(flavour):
    calls = [Call("c1", ORDER, {"id": 1}), Call("c2", WEATHER, {"id": 2}),
             Call("c3", ORDER, {"id": 3})]
    scripts = [Script([Audio(chunks=10), ToolCall(calls), Audio(chunks=5), TurnComplete(),
                       WaitToolResponse(["c1", "c2", "c3"]), Audio(chunks=2), TurnComplete()],
                      reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=8)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, tool_delay={ORDER: 0.2, WEATHER: 0.02})

    issued_at = run.connections[0].sent[10].at
    stop = run.tap.first_stop_after(issued_at)
    for call in calls:
        ran = assert_ran_once(run, call.id)
        assert stop is not None and ran["t"] >= stop, f"{call.id} ran mid-speech"
        assert_answered_once(run, call.id, call.name, via="tool_response", connection=0)
    assert [r["call_id"] for r in run.runs()] == ["c1", "c2", "c3"], "not in request order"
    assert_server_clean(run)

    if flavour.durable:
        starts = [run.at("tool.call_started", call_id=c.id) for c in calls]
        assert starts == sorted(starts)
        assert max(run.at("tool.call_deferred", call_id=c.id) for c in calls) < starts[0]
        assert_log_settled(run)
        await assert_chain_ok(run)


# --------------------------------------------------------------------------- long calls

@PROMPT_RECONNECTS
@pytest.mark.stock_bug("after a reconnect pipecat forgets what it sent and re-sends earlier "
                       "results as 'tool_call_result'; it ignores goAway; a new prompt never "
                       "gets a session")
async def test_three_reconnects_in_one_call(flavour):
    scripts = [
        # 1: an error close
        Script([ToolCall(Call("c1", ORDER, {"id": 1})), WaitToolResponse("c1"), Audio(chunks=2),
                TurnComplete(), Close(1011, "internal error")], reply=()),
        # 2: goAway
        Script([ToolCall(Call("c2", WEATHER, {"id": 2})), WaitToolResponse("c2"), Audio(chunks=2),
                TurnComplete(), GoAway(time_left=3.0, close_code=1000)], reply=()),
        # 3: a new prompt (sent by the test once c3 is answered)
        Script([ToolCall(Call("c3", ORDER, {"id": 3})), WaitToolResponse("c3"), Audio(chunks=2),
                TurnComplete()], reply=()),
        Script([ToolCall(Call("c4", WEATHER, {"id": 4})), WaitToolResponse("c4"), Audio(chunks=2),
                TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(2) and not ctl.tap.speaking, timeout=12)
        await ctl.settle(0.3)
        await ctl.task.queue_frame(LLMUpdateSettingsFrame(
            delta=GeminiLiveLLMService.Settings(system_instruction="V3")))
        await ctl.wait(lambda: ctl.script_done(3) and not ctl.tap.speaking, timeout=8)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, policy=Policy(go_away_margin_s=1.0))

    assert_server_clean(run)
    assert_no_fallback_names(run)
    assert len(run.connections) == 4
    for index in (1, 2):
        assert run.connections[index].resumption_handle == handles_of(run.server, index - 1)[-1]
    # A new prompt on a model without contextUpdate: a fresh session seeded from the log (a
    # resumed one is not known to adopt the prompt of its setup).
    assert run.connections[3].resumption_handle is None
    assert [c.system_instruction for c in run.connections] == ["Be brief."] * 3 + ["V3"]
    assert run.connections[1].closed_by == "client", "goAway: we must leave before the deadline"
    for index, (call_id, name) in enumerate([("c1", ORDER), ("c2", WEATHER), ("c3", ORDER),
                                             ("c4", WEATHER)]):
        answers = run.results(call_id)
        assert [(r.connection, r.via, r.name) for r in answers] == (
            [(index, "tool_response", name)]
            # the fresh session's seed carries the earlier results (a new model state)
            + ([(3, "content", name)] if index < 3 else [])), answers
        assert all(r.accepted for r in answers)
        assert_ran_once(run, call_id)
    assert len(run.results()) == 7

    if flavour.durable:
        assert [e.data["reason"] for e in run.find("connection.disconnected")] == [
            "error", "go_away", "settings", "shutdown"]
        assert [e.data["generation"] for e in run.find("connection.connected")] == [1, 2, 3, 4]
        assert_log_settled(run)
        await assert_chain_ok(run)


@BLOCKING_CALLS
@pytest.mark.stock_bug("a result for a call two sessions old goes out as a toolResponse the "
                       "current session never issued, under the name 'tool_call_result'")
async def test_result_for_a_call_issued_two_generations_ago(flavour):
    scripts = [
        Script([Audio(chunks=2), TurnComplete(), ToolCall(Call("c1", ORDER, {"id": 1})),
                Sleep(0.2), Close(1011, "internal error")], reply=()),
        Script([Audio(chunks=2), TurnComplete(), Sleep(0.2), Close(1011, "internal error")],
               reply=()),
        Script([WaitToolResponse("c1", timeout=3), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(2) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, tool_delay=2.0)

    assert len(run.connections) == 3
    assert run.connections[2].resumption_handle == handles_of(run.server, 1)[-1]
    assert_server_clean(run)
    assert_no_fallback_names(run)
    assert_answered_once(run, "c1", ORDER, via=content_via(run), connection=2)
    assert_ran_once(run, "c1")

    if flavour.durable:
        assert run.find("tool.call_requested", call_id="c1")[0].data["generation"] == 1
        assert run.at("connection.connected", generation=3) < run.at("tool.call_completed",
                                                                     call_id="c1")
        assert [(e.data["generation"], e.data["via"])
                for e in run.find("tool.result_sent", call_id="c1")] == [
                    (3, content_via(run, logged=True))]
        assert_log_settled(run)
        await assert_chain_ok(run)
