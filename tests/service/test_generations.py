"""What the service does differently per Gemini Live generation, on the wire.

Each scenario names a model; the local server applies that generation's rules (clientContent
refused after the first model turn from 3.1 on, NON_BLOCKING calls, interactionStatus on
thinking models, contextUpdate from 3.8, a resumed session keeping its handle's prompt) and
flags every breach. Each runs on SQLite and PostgreSQL and, where stock pipecat gets it
wrong, against the stock service as a strict xfail naming the upstream bug.
"""

from __future__ import annotations

import pytest
from pipecat.frames.frames import LLMSetToolsFrame, LLMUpdateSettingsFrame
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.local_live import (Audio, Call, Close, GoAway, InputTranscript, OutputTranscript,
                                ResumptionUpdate, Script, Sleep, ToolCall, TurnComplete, WaitFor,
                                WaitIntermediate, WaitToolResponse)
from rig.testing.pipeline import make_tool, tools_schema
from session_store import Policy

from .helpers import (Ctl, assert_answered_once, assert_chain_ok, assert_log_settled,
                      assert_ran_once, assert_server_clean, handles_of, run_call)

G25 = "models/gemini-2.5-flash-native-audio-preview"
G31 = "models/gemini-3.1-flash-live-preview"
G38 = "models/gemini-3.8-live"
G38T = "models/gemini-3.8-live-extended-thinking"
ORDER, WEATHER = "lookup_order", "get_weather"

pytestmark = [pytest.mark.timeout(120), pytest.mark.own_model]


@pytest.mark.stock_bug("a result produced during a reconnect is dropped (no session)")
@pytest.mark.parametrize("model", [G31, G38T])
async def test_a_result_as_content_on_a_resumed_3_x_session_goes_as_realtime_text(flavour,
                                                                                 model):
    """The issue's report: on 3.1 a result that goes to a resumed session as content was
    sent as clientContent, the server closed 1007, the service resumed from the same handle
    and sent it again, for ever. It goes as realtimeInput.text: no refusal, answered once.
    (On 3.8 thinking the call is NON_BLOCKING and starts at once; its result is made while
    no session is open, and goes the same way.)"""
    scripts = [
        Script([WaitFor("client_content"), Audio(chunks=2), TurnComplete(),
                ToolCall(Call("c1", ORDER, {"id": 1})), Close(1011, "internal error")],
               reply=()),
        Script([WaitToolResponse("c1", timeout=8), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=15)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, model=model, tool_delay=0.3)

    profile = "3.1" if model == G31 else "3.8-thinking"
    assert [c.profile for c in run.connections] == [profile, profile]
    assert len(run.connections) == 2, "a refused send would have closed the session"
    # Durable: the handle predates c1, so it is not resumed (the model would ask again); the
    # fresh session's seed names c1 and its result goes in the seed or after it as text.
    assert run.connections[1].resumption_handle == (
        None if flavour.durable else handles_of(run.server, 0)[-1])
    assert_server_clean(run)
    assert_answered_once(run, "c1", ORDER, via="realtime", connection=1)
    assert_ran_once(run, "c1")
    if flavour.durable:
        assert run.find("tool.result_sent", call_id="c1")[0].data["via"] == "text"
        assert_log_settled(run)
        await assert_chain_ok(run)


@pytest.mark.stock_bug("goAway is ignored, and results sent after the handle the next "
                       "session resumes from never reach it")
@pytest.mark.parametrize("model", [G25, G38, G38T])
async def test_a_non_blocking_call_s_intermediate_results_reach_the_model_once_each(
        flavour, model):
    """An async tool (cancel_on_interruption=False) is declared NON_BLOCKING; its two
    intermediate results go with willContinue true and its outcome closes the call, each
    once, with pipecat's scheduling (3.8 thinking takes neither: it gets the outcome alone,
    with no scheduling); a goAway between them moves the call to a session
    resumed from a handle issued after the first (NON_BLOCKING: a handle while the call is
    open), which gets the rest and nothing twice. (A handle issued before it would hold
    none, and the first would go again: tests/core/test_model_generations.py.)"""
    scripts = [
        Script([WaitFor("client_content"), Audio(chunks=2), TurnComplete(),
                ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=2), TurnComplete(),
                (WaitToolResponse("c1", timeout=4) if model == G38T
                 else WaitIntermediate("c1", 1, timeout=4)), ResumptionUpdate(),
                GoAway(time_left=4.0, close_code=1000),
                Sleep(4.5)], reply=()),
        Script([WaitToolResponse("c1", timeout=6), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=16)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, model=model, progress={ORDER: 2},
                         tool_delay=0.4, policy=Policy(go_away_margin_s=1.0))

    assert_server_clean(run)
    assert_ran_once(run, "c1")
    got = run.results("c1")
    shown = "\n".join(f"{r.connection} {r.via} final={r.final} wc={r.will_continue} "
                      f"sched={r.scheduling} {r.response}" for r in got)
    assert all(r.via == "tool_response" for r in got), shown
    assert all(r.will_continue is (not r.final) for r in got), shown
    last = run.connections[-1]
    assert last.resumption_handle is not None, "the call moved by resumption"
    assert "c1" in last.state.results
    if model == G38T:
        # Thinking refuses `scheduling` (1007) and abandons a call after an intermediate
        # result (openclaw PR 152413): the intermediate results are logged, not sent.
        assert {r.scheduling for r in got} == {None}, shown
        assert all(r.final for r in got), shown
    else:
        assert {r.scheduling for r in got} == {"WHEN_IDLE"}, shown
        assert [r.response.get("step") for r in got if r.connection == 0][:1] == [1], shown
        # The session the call ends on holds each intermediate result and the outcome, once
        # (what its handle held plus what it was sent: the server flags any second copy).
        assert [r.response["step"] for r in last.state.intermediates["c1"]] == [1, 2], shown
    if flavour.durable:
        [req] = run.find("tool.call_requested", call_id="c1")
        assert (req.data["mode"], req.data["declared"]) == ("non_blocking", "NON_BLOCKING")
        assert [e.data["part"] for e in run.find("tool.call_progress")] == [1, 2]
        assert run.find("tool.call_completed")[0].data["scheduling"] == "WHEN_IDLE"
        assert_log_settled(run)
        await assert_chain_ok(run)


def prompt_changed_then(last_connection: int):
    """A drive: once the first session issued a handle and the bot is silent, the app
    changes the prompt; the call ends once `last_connection`'s script is done."""
    async def drive(ctl: Ctl):
        await ctl.wait(lambda: bool(handles_of(ctl.server, 0)) and not ctl.tap.speaking,
                       timeout=5)
        await ctl.task.queue_frame(LLMUpdateSettingsFrame(
            delta=GeminiLiveLLMService.Settings(system_instruction="Be terse.")))
        await ctl.wait(lambda: ctl.script_done(last_connection) and not ctl.tap.speaking,
                       timeout=10)
        await ctl.settle()
    return drive


@pytest.mark.stock_bug("a prompt change is only stored: pipecat never applies it")
async def test_a_prompt_change_on_3_8_goes_in_session_with_no_reconnect(flavour):
    scripts = [Script([WaitFor("client_content"), Audio(chunks=2), TurnComplete(),
                       WaitFor("context_update", timeout=5), Audio(chunks=2), TurnComplete()],
                      reply=())]

    run = await run_call(flavour, scripts, prompt_changed_then(0), model=G38)

    assert len(run.connections) == 1, "no reconnect"
    assert_server_clean(run)
    state = run.connections[0].state
    assert state.system_instruction == "Be terse."
    assert len(state.context_updates) == 1
    if flavour.durable:
        [changed] = run.find("settings.changed")
        assert (changed.data["in_session"], changed.data["needs_reconnect"]) == (True, False)
        assert len(run.find("settings.context_sent")) == 1
        assert not run.find("connection.reconnect_requested")
        assert_log_settled(run)


async def test_a_session_resumed_from_a_handle_before_the_prompt_change_gets_it_once_more(
        flavour):
    """3.8: the update went in on the first session, which then dropped before issuing a
    handle that holds it; the session resumed from the older handle is sent it again, once
    (the server's state keeps its handle's prompt whatever the setup says)."""
    if not flavour.durable:
        pytest.skip("the stock service never applies a prompt change")
    scripts = [
        Script([WaitFor("client_content"), Audio(chunks=2), TurnComplete(),
                WaitFor("context_update", timeout=5), Sleep(0.2), Close(1011, "internal error")],
               reply=()),
        Script([WaitFor("context_update", timeout=5), Audio(chunks=2), TurnComplete()],
               reply=()),
    ]

    run = await run_call(flavour, scripts, prompt_changed_then(1), model=G38)

    assert_server_clean(run)
    assert len(run.connections) == 2
    assert run.connections[1].resumption_handle == handles_of(run.server, 0)[0]
    assert [c.state.system_instruction for c in run.connections] == ["Be terse."] * 2
    assert [len(c.state.context_updates) for c in run.connections] == [1, 1]
    assert [e.data["generation"] for e in run.find("settings.context_sent")] == [1, 2]
    assert_log_settled(run)


@pytest.mark.stock_bug("goAway is ignored: the server closes the session mid-turn")
async def test_on_a_thinking_model_a_planned_reconnect_waits_for_idle(flavour):
    """3.8 thinking: turnComplete does not mean idle. A goAway whose deadline is far off
    reconnects only once the server says IDLE (after the NON_BLOCKING call is answered
    and the model has finished), not at the first turnComplete."""
    scripts = [
        Script([WaitFor("client_content"), Audio(chunks=2), TurnComplete(),
                ToolCall(Call("c1", ORDER, {"id": 1})), GoAway(time_left=9.0, close_code=1000),
                Audio(chunks=2), TurnComplete(), WaitToolResponse("c1", timeout=5),
                Audio(chunks=3), TurnComplete()], reply=()),
        Script([Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=15)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, model=G38T, tool_delay=0.6,
                         policy=Policy(go_away_margin_s=1.0))

    assert_server_clean(run)
    assert len(run.connections) == 2
    assert run.connections[0].closed_by == "client", "left before the deadline"
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    if flavour.durable:
        idle = [e for e in run.find("model.interaction_status") if e.data["status"] == "IDLE"]
        disconnect = run.at("connection.disconnected", generation=1)
        assert idle and idle[0].version < disconnect, run.timeline()
        # Not before: the call was open (IN_PROGRESS) through the first turnComplete.
        assert run.at("tool.result_sent", call_id="c1") < disconnect
        assert_log_settled(run)


async def test_on_2_5_turns_after_the_handle_reach_the_resumed_session_once(flavour):
    """A turn heard after the last handle (the user spoke, the model answered, no new handle
    came before the socket dropped): the session resumed from that handle never heard it, so
    it is told as content, once; the earlier turn, which the handle holds, is not."""
    if not flavour.durable:
        pytest.skip("the stock service keeps no conversation of its own")
    scripts = [
        Script([WaitFor("client_content"), InputTranscript("Where is order 42?"),
                OutputTranscript("It shipped."), Audio(chunks=2), TurnComplete(),
                ResumptionUpdate(), InputTranscript("And order 43?"),
                OutputTranscript("Also shipped."), Audio(chunks=2), TurnComplete(),
                Close(1011, "internal error")], reply=(), resumption_after_turn=False),
        Script([WaitFor("client_content", timeout=5), Audio(chunks=2), TurnComplete()],
               reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, model=G25)

    assert_server_clean(run)
    assert run.connections[1].resumption_handle == handles_of(run.server, 0)[-1]
    said = [(e.role, e.text) for e in run.connections[1].state.conversation]
    assert said.count(("user", "And order 43?")) == 1, said
    assert said.count(("user", "Where is order 42?")) == 1, said
    [sent] = run.find("conversation.sending", generation=2)
    assert sent.data["via"] == "content"
    assert run.find("conversation.sent", generation=2)
    assert_log_settled(run)


@pytest.mark.parametrize("model", [G31, G38])
async def test_on_3_x_a_handle_that_lacks_turns_is_not_resumed(flavour, model):
    """Where clientContent is refused mid-session, a resumed session cannot be told the
    turns its handle lacks: the new session starts fresh, seeded with every turn once."""
    if not flavour.durable:
        pytest.skip("the stock service keeps no conversation of its own")
    first = Script([WaitFor("client_content"), InputTranscript("Where is order 42?"),
                    OutputTranscript("It shipped."), Audio(chunks=2), TurnComplete(),
                    ResumptionUpdate(), InputTranscript("And order 43?"),
                    OutputTranscript("Also shipped."), Audio(chunks=2), TurnComplete(),
                    Close(1011, "internal error")], reply=(), resumption_after_turn=False)
    second = Script([WaitFor("client_content", timeout=5), Audio(chunks=2), TurnComplete()],
                    reply=())

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, [first, second], drive, model=model)

    assert_server_clean(run)
    assert handles_of(run.server, 0), "the first session did issue a handle"
    assert run.connections[1].resumption_handle is None
    said = [(e.role, e.text) for e in run.connections[1].state.conversation]
    for turn in ("Where is order 42?", "And order 43?"):
        assert said.count(("user", turn)) == 1, said
    assert_log_settled(run)


async def test_3_1_with_a_long_prompt_reconnects_to_a_fresh_seeded_session(flavour):
    """Resumption on 3.1 was reported to lose the context once the system instruction is
    over ~200 tokens: by default (Policy.resumption="auto") such a call never resumes."""
    if not flavour.durable:
        pytest.skip("the stock service resumes (and the server restores nothing)")
    long_prompt = "Be brief and kind. " * 60  # ~285 tokens
    scripts = [
        Script([WaitFor("client_content"), InputTranscript("Where is order 42?"),
                Audio(chunks=2), TurnComplete(), Close(1011, "internal error")], reply=()),
        Script([WaitFor("client_content", timeout=5), Audio(chunks=2), TurnComplete()],
               reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, model=G31, system_instruction=long_prompt)

    assert_server_clean(run)
    assert handles_of(run.server, 0)
    assert run.connections[1].resumption_handle is None
    assert not run.connections[1].notes_of("context_lost_on_resume")
    said = [(e.role, e.text) for e in run.connections[1].state.conversation]
    assert said.count(("user", "Where is order 42?")) == 1, said
    assert_log_settled(run)


@pytest.mark.parametrize("model, in_session", [(G38, True), (G25, False)])
async def test_a_tools_change_goes_in_by_context_update_or_a_fresh_session(
        flavour, model, in_session):
    """LLMSetToolsFrame (pipecat ignores it for Gemini Live): on 3.8 a contextUpdate with the
    new tools; on 2.5 a new session, fresh (a resumed one keeps its handle's tools)."""
    if not flavour.durable:
        pytest.skip("pipecat ignores LLMSetToolsFrame for Gemini Live")
    scripts = [
        Script([WaitFor("client_content"), Audio(chunks=2), TurnComplete(),
                *([WaitFor("context_update", timeout=5)] if in_session else [Sleep(3)]),
                ToolCall(Call("c1", WEATHER, {"id": 1})), WaitToolResponse("c1", timeout=4),
                Audio(chunks=2), TurnComplete()], reply=()),
        Script([ToolCall(Call("c2", WEATHER, {"id": 2})), WaitToolResponse("c2", timeout=4),
                Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: bool(handles_of(ctl.server, 0)) and not ctl.tap.speaking,
                       timeout=5)
        ctl.llm.register_function(WEATHER, make_tool(WEATHER, ctl.ledger))
        await ctl.task.queue_frame(LLMSetToolsFrame(tools=tools_schema([ORDER, WEATHER])))
        done = 0 if in_session else 1
        await ctl.wait(lambda: ctl.script_done(done) and not ctl.tap.speaking, timeout=12)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, model=model, tools=[ORDER])
    run_llm_tools = run.connections[-1].state.tool_names

    assert_server_clean(run)
    assert WEATHER in run_llm_tools
    if in_session:
        assert len(run.connections) == 1
        assert len(run.connections[0].state.context_updates) == 1
    else:
        assert len(run.connections) == 2
        assert run.connections[1].resumption_handle is None
    [changed] = run.find("settings.changed")
    assert changed.data["keys"] == ["tools"] and changed.data["in_session"] is in_session


async def test_on_a_thinking_model_a_call_is_deferred_only_when_the_policy_says_so(flavour):
    """Every call is NON_BLOCKING on 3.8 thinking: by default it starts while the bot
    speaks; with Policy(defer_non_blocking=True) it waits for the bot to stop, as a blocking
    call does. Either way it is answered once, with will_continue false and no scheduling
    (the model refuses the field)."""
    if not flavour.durable:
        pytest.skip("stock pipecat defers nothing")
    scripts = [Script([WaitFor("client_content"), Audio(chunks=2),
                       ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=10), TurnComplete(),
                       WaitToolResponse("c1", timeout=6), Audio(chunks=2), TurnComplete()],
                      reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=12)
        await ctl.settle()

    for deferred in (False, True):
        run = await run_call(flavour, scripts, drive, model=G38T,
                             policy=Policy(defer_non_blocking=deferred))
        assert_server_clean(run)
        ran = assert_ran_once(run, "c1")
        [answer] = run.results("c1")
        assert (answer.will_continue, answer.scheduling) == (False, None)
        speech_ends = run.tap.first_stop_after(run.connections[0].sent[1].at)
        assert speech_ends is not None
        assert (ran["t"] >= speech_ends) is deferred, (deferred, ran["t"], speech_ends)
        assert bool(run.find("tool.call_deferred", call_id="c1")) is deferred
        assert_log_settled(run)
