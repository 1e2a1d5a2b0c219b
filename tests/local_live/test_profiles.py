"""Model profiles of the local Gemini Live server, driven by the real google-genai client.

For every wire rule a generation enforces (``service/local_live/profiles.py``) there is a
client that breaks it and is caught (the close code and the violation) and one that follows
it and is not.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from google import genai
from google.genai import errors, types

from service.local_live import (
    PROFILES,
    Audio,
    Call,
    CancelToolCalls,
    ConversationEntry,
    InputTranscript,
    InteractionStatus,
    LocalLiveServer,
    OutputTranscript,
    ResumptionUpdate,
    Script,
    ToolCall,
    TurnComplete,
    WaitFor,
    WaitIntermediate,
    WaitSignal,
    WaitToolResponse,
    http_options,
    profile_for,
)
from service.local_live.profiles import BLOCKING, NON_BLOCKING, gemini_version
from tests.local_live.helpers import receive_until, turn_complete

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MODELS = {
    "2.5": "gemini-2.5-flash-native-audio-preview-09-2025",
    "3.1": "gemini-3.1-flash-live-preview",
    "3.8": "gemini-3.8-live",
    "3.8-thinking": "gemini-3.8-live-extended-thinking",
}
THREE_X = ("3.1", "3.8", "3.8-thinking")
#: Generations that take clientContent only as a fresh session's first history (3.8 Live's
#: model page documents it through the whole session).
SEEDS_ONLY = ("3.1", "3.8-thinking")
INVALID = 1007
LONG_PROMPT = "Be helpful. " * 70  # 840 characters: 210 tokens at four characters a token


def lookup_tool(behavior: str | None = None, name: str = "lookup_order") -> types.Tool:
    declaration = types.FunctionDeclaration(name=name, description="Find an order.")
    if behavior is not None:
        declaration.behavior = types.Behavior(behavior)
    return types.Tool(function_declarations=[declaration])


def connect(server: LocalLiveServer, profile: str, *, history: bool = True,
            behavior: str | None = None, **overrides: Any):
    """A session on the model of ``profile``, configured as pipecat configures it."""
    config: dict[str, Any] = {
        "response_modalities": [types.Modality.AUDIO],
        "system_instruction": "You are a shop assistant.",
        "tools": [lookup_tool(behavior)],
        "session_resumption": types.SessionResumptionConfig(),
    }
    if history:
        config["history_config"] = types.HistoryConfig(initial_history_in_client_content=True)
    config.update(overrides)
    client = genai.Client(api_key="test-key", http_options=server.http_options())
    return client.aio.live.connect(model=MODELS[profile], config=types.LiveConnectConfig(**config))


def resume(handle: str) -> types.SessionResumptionConfig:
    return types.SessionResumptionConfig(handle=handle)


async def close_code(session) -> int:
    """Read until the server closes the socket; the close code the client saw."""
    with pytest.raises(errors.APIError) as closed:
        await receive_until(session, lambda message: False)
    return closed.value.code


def has_handle(message: types.LiveServerMessage) -> bool:
    update = message.session_resumption_update
    return bool(update and update.new_handle)


def text_turn(text: str, role: str = "user") -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=text)])


def response(call_id: str, will_continue: bool | None = None, scheduling: str | None = None,
             **payload: Any) -> types.FunctionResponse:
    answer = types.FunctionResponse(id=call_id, name="lookup_order",
                                    response=payload or {"status": "shipped"})
    if will_continue is not None:
        answer.will_continue = will_continue
    if scheduling is not None:
        answer.scheduling = types.FunctionResponseScheduling(scheduling)
    return answer


def kinds(server: LocalLiveServer) -> list[str]:
    return [violation["kind"] for violation in server.violations]


# --- choosing the profile ---------------------------------------------------------------------

PIPECAT_IDS = [
    "gemini-2.5-flash-native-audio-preview-09-2025",
    "models/gemini-2.5-flash-native-audio-preview",
    "gemini-2.0-flash-live-001",
    "gemini-2.5-flash-exp-native-audio-thinking-dialog",
    "gemini-live",
    "gemini-live-2.5-flash-native-audio",
    "gemini-3-pro-live",
    "gemini-3.1-flash-live-preview",
    "models/gemini-3.1-flash-live-preview",
    "gemini-3.8-live",
    "gemini-3.8-live-extended-thinking",
    "gemini-4-live",
]


@pytest.mark.parametrize("model", PIPECAT_IDS)
def test_profile_follows_pipecats_reading_of_the_model_id(model: str) -> None:
    """Same version and the same four rules as pipecat 1.14 derives from the id."""
    from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

    service = GeminiLiveLLMService(api_key="k", settings=GeminiLiveLLMService.Settings(model=model))
    profile = profile_for(model)
    assert gemini_version(model.removeprefix("models/")) == service._gemini_version
    assert profile.accepts_non_blocking == service._supports_non_blocking_tools
    assert (profile.default_mode == NON_BLOCKING) == service._tools_default_to_non_blocking
    assert profile.accepts_blocking == service._supports_blocking_tools
    assert profile.interaction_status == service._expects_interaction_status


def test_profile_names() -> None:
    assert [profile_for(model).name for model in MODELS.values()] == list(MODELS)
    assert sorted(PROFILES) == sorted(MODELS)


async def test_standalone_server_can_force_a_profile(tmp_path) -> None:
    record = tmp_path / "record.json"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service.local_live", "--profile", "3.1", "--record", str(record),
        "--exit-after", "1", stdout=asyncio.subprocess.PIPE, cwd=PROJECT_ROOT,
    )
    try:
        ready = json.loads(await asyncio.wait_for(process.stdout.readline(), 10))
        client = genai.Client(api_key="k", http_options=http_options(ready["base_url"],
                                                                     ready["cert_path"]))
        async with client.aio.live.connect(model=MODELS["2.5"], config=types.LiveConnectConfig(
                response_modalities=[types.Modality.AUDIO])) as session:
            [usage] = await receive_until(session, lambda m: m.usage_metadata is not None)
        await asyncio.wait_for(process.wait(), 10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert json.loads(record.read_text())["connections"][0]["profile"] == "3.1"


async def test_connection_records_its_profile_and_the_server_can_force_one() -> None:
    async with LocalLiveServer() as server:
        async with connect(server, "3.8"):
            pass
        await server.wait_for_close(0)
    assert server.connections[0].profile == "3.8"
    assert server.connections[0].to_json()["profile"] == "3.8"
    async with LocalLiveServer(profile="3.1") as server:
        async with connect(server, "2.5", history=False) as session:
            await session.send_client_content(turns=[text_turn("hi")], turn_complete=False)
            assert await close_code(session) == INVALID
    assert server.connections[0].profile == "3.1"
    with pytest.raises(ValueError, match="unknown profile"):
        LocalLiveServer(profile="9.9")


# --- clientContent on 3.x ---------------------------------------------------------------------


@pytest.mark.parametrize("profile", SEEDS_ONLY)
async def test_client_content_without_history_config_is_refused(profile: str) -> None:
    async with LocalLiveServer(Script(reply=())) as server:
        async with connect(server, profile, history=False) as session:
            await session.send_client_content(turns=[text_turn("hi")], turn_complete=False)
            assert await close_code(session) == INVALID
        connection = await server.wait_for_close(0)
    assert kinds(server) == ["client_content_refused"]
    assert (connection.close_code, connection.close_reason) == (
        INVALID, "Request contains an invalid argument.")
    assert connection.state.conversation == [], "a refused message must not reach the model"


@pytest.mark.parametrize("profile", SEEDS_ONLY)
async def test_client_content_after_the_first_model_output_is_refused(profile: str) -> None:
    script = Script([Audio(chunks=1), TurnComplete()], reply=(), resumption_after_turn=False)
    async with LocalLiveServer(script) as server, connect(server, profile) as session:
        await receive_until(session, turn_complete)
        await session.send_client_content(turns=[text_turn("hi")], turn_complete=True)
        assert await close_code(session) == INVALID
    assert kinds(server) == ["client_content_refused"]
    assert "already answered" in server.violations[0]["detail"]


@pytest.mark.parametrize("profile", SEEDS_ONLY)
async def test_client_content_on_a_resumed_session_is_refused(profile: str) -> None:
    """The loop of issue 23: a result as content to a resumed 3.x session closes it."""
    first = Script([ResumptionUpdate()], reply=())
    async with LocalLiveServer([first, Script(reply=())]) as server:
        async with connect(server, profile) as session:
            message = (await receive_until(session, has_handle))[-1]
        handle = message.session_resumption_update.new_handle
        async with connect(server, profile, session_resumption=resume(handle)) as session:
            result = '[Function lookup_order (call_id c1) returned {"status": "shipped"}]'
            await session.send_client_content(turns=[text_turn(result)], turn_complete=True)
            assert await close_code(session) == INVALID
    assert kinds(server) == ["client_content_refused"]
    assert server.connections[1].results == []
    assert "resumed" in server.violations[0]["detail"]


async def test_3_8_takes_client_content_mid_session() -> None:
    """3.8 Live: clientContent after the model's turn, and on a resumed session, joins the
    context instead of closing the socket (3.1 and 3.8 thinking: the tests above)."""
    first = Script([Audio(chunks=1), TurnComplete(), ResumptionUpdate()], reply=())
    async with LocalLiveServer([first, Script(reply=())]) as server:
        async with connect(server, "3.8", history=False) as session:
            message = (await receive_until(session, has_handle))[-1]
            await session.send_client_content(turns=[text_turn("heard only: hello")],
                                              turn_complete=False)
            await server.wait_until(lambda: received(server, 0))
        handle = message.session_resumption_update.new_handle
        async with connect(server, "3.8", session_resumption=resume(handle)) as session:
            await session.send_client_content(turns=[text_turn("again")], turn_complete=False)
            await server.wait_until(lambda: received(server, 1))
    assert server.violations == []
    assert server.connections[0].state.conversation[-1] == ("user", "heard only: hello",
                                                            "content")
    assert server.connections[1].state.conversation[-1] == ("user", "again", "content")


def received(server: LocalLiveServer, index: int) -> bool:
    return len(server.connections) > index and any(
        m.kind == "client_content" for m in server.connections[index].received)


@pytest.mark.parametrize("profile", THREE_X)
async def test_seed_before_the_first_output_then_realtime_text_is_accepted(profile: str) -> None:
    seed = [
        text_turn("Where is order 7?"),
        text_turn('[Called function lookup_order with args {"orderId": 7}]', "model"),
        text_turn('[Function lookup_order returned {"status": "shipped"}]'),
    ]
    script = Script([WaitFor("client_content"), Audio(chunks=1), TurnComplete()], reply=(),
                    resumption_after_turn=False)
    async with LocalLiveServer(script) as server:
        async with connect(server, profile) as session:
            connection = await server.wait_for_connection(0)
            await session.send_client_content(turns=seed, turn_complete=False)
            await receive_until(session, turn_complete)
            await session.send_realtime_input(text="And order 8?")
            await server.wait_until(lambda: len(connection.state.conversation) == 3)
        await server.wait_for_close(0)
    server.assert_clean()
    assert connection.closed_by == "client"
    assert connection.state.conversation == [
        ConversationEntry("user", "Where is order 7?", "content"),
        ConversationEntry("model", '[Called function lookup_order with args {"orderId": 7}]',
                          "content"),
        ConversationEntry("user", "And order 8?", "realtime"),
    ]
    assert [(r.via, r.accepted) for r in connection.results] == [("content", True)]


async def test_client_content_is_accepted_any_time_on_2_5() -> None:
    first = Script([Audio(chunks=1), TurnComplete()], reply=())
    async with LocalLiveServer([first, Script(reply=())]) as server:
        async with connect(server, "2.5", history=False) as session:
            messages = await receive_until(session, has_handle)
            await session.send_client_content(turns=[text_turn("after output")], turn_complete=True)
            await server.wait_until(lambda: server.connections[0].state.conversation)
        handle = messages[-1].session_resumption_update.new_handle
        async with connect(server, "2.5", history=False, session_resumption=resume(handle)) as session:
            await session.send_client_content(turns=[text_turn("resumed")], turn_complete=True)
            await server.wait_until(lambda: len(server.connections) == 2
                                    and server.connections[1].state.conversation)
    server.assert_clean()
    assert [e.text for e in server.connections[1].state.conversation] == ["resumed"]


# --- 3.1 extras: the usage-only serverContent, and resumption with a long prompt ---------------


async def test_3_1_sends_a_usage_only_server_content_after_setup_and_it_is_no_model_turn() -> None:
    async with LocalLiveServer(Script(reply=())) as server:
        async with connect(server, "3.1") as session:
            [usage] = await receive_until(session, lambda m: m.usage_metadata is not None)
            # It is not model output: seeding is still allowed after it.
            await session.send_client_content(turns=[text_turn("seed")], turn_complete=False)
            await server.wait_until(lambda: server.connections[0].state.conversation)
        async with connect(server, "2.5") as session:
            await server.wait_for_connection(1)
    assert usage.server_content is not None and usage.server_content.model_turn is None
    assert server.connections[0].sent_kinds() == ["setupComplete", "serverContent"]
    assert server.connections[0].model_output_at is None
    assert server.connections[1].sent_kinds() == ["setupComplete"]
    server.assert_clean()


@pytest.mark.parametrize(("profile", "prompt", "lost"), [
    ("3.1", LONG_PROMPT, True),
    ("3.1", "Short prompt.", False),
    ("3.8", LONG_PROMPT, False),
])
async def test_3_1_resumption_with_a_long_system_instruction_restores_nothing(
        profile: str, prompt: str, lost: bool) -> None:
    first = Script([ToolCall([Call("c1", "lookup_order")]), WaitToolResponse("c1"),
                    ResumptionUpdate()], reply=())
    behavior = BLOCKING if profile == "3.8" else None
    async with LocalLiveServer([first, Script(reply=())]) as server:
        async with connect(server, profile, system_instruction=prompt, behavior=behavior) as session:
            await receive_until(session, lambda m: m.tool_call is not None)
            await session.send_tool_response(function_responses=response("c1"))
            message = (await receive_until(session, has_handle))[-1]
        handle = message.session_resumption_update.new_handle
        async with connect(server, profile, system_instruction=prompt, behavior=behavior,
                           session_resumption=resume(handle)):
            resumed = await server.wait_for_connection(1)
    assert resumed.resumed_from == handle
    assert bool(resumed.notes_of("context_lost_on_resume")) is lost
    assert ("c1" in resumed.state.results) is not lost
    assert resumed.state.system_instruction == prompt
    server.assert_clean()


async def test_a_resumed_session_keeps_the_handles_prompt_and_ignores_the_setups() -> None:
    async with LocalLiveServer([Script([ResumptionUpdate()]), Script(), Script()]) as server:
        async with connect(server, "2.5", system_instruction="Old prompt.") as session:
            message = (await receive_until(session, has_handle))[-1]
        handle = message.session_resumption_update.new_handle
        async with connect(server, "2.5", system_instruction="New prompt.",
                           tools=[lookup_tool(name="refund")], session_resumption=resume(handle)):
            changed = await server.wait_for_connection(1)
        async with connect(server, "2.5", system_instruction="Old prompt.",
                           session_resumption=resume(handle)):
            same = await server.wait_for_connection(2)
    assert changed.state.system_instruction == "Old prompt."
    assert changed.state.tool_names == ["lookup_order"]
    assert [note["kind"] for note in changed.notes] == ["setup_prompt_ignored", "setup_tools_ignored"]
    assert same.notes == [] and same.state.system_instruction == "Old prompt."
    assert changed.to_json()["notes"] == changed.notes
    server.assert_clean()


# --- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize(("profile", "behavior", "violation"), [
    ("3.1", NON_BLOCKING, "non_blocking_unsupported"),
    ("3.8-thinking", BLOCKING, "blocking_unsupported"),
])
async def test_a_declaration_the_generation_does_not_run_refuses_the_setup(
        profile: str, behavior: str, violation: str) -> None:
    async with LocalLiveServer() as server:
        with pytest.raises(errors.APIError) as refused:
            async with connect(server, profile, behavior=behavior):
                pass
        connection = await server.wait_for_close(0)
    assert refused.value.code == INVALID
    assert kinds(server) == [violation]
    assert connection.sent == [], "no setupComplete"


@pytest.mark.parametrize(("profile", "behavior"), [
    ("2.5", NON_BLOCKING), ("2.5", BLOCKING), ("3.1", BLOCKING), ("3.1", None),
    ("3.8", BLOCKING), ("3.8", NON_BLOCKING), ("3.8-thinking", NON_BLOCKING),
    ("3.8-thinking", None),
])
async def test_a_declaration_the_generation_runs_is_accepted(profile: str, behavior: str | None) -> None:
    async with LocalLiveServer() as server, connect(server, profile, behavior=behavior) as session:
        assert session.setup_complete is not None
        connection = await server.wait_for_connection(0)
    assert connection.state.tools == {"lookup_order": behavior}
    server.assert_clean()


# --- call modes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("profile", "behavior", "mode"), [
    ("2.5", None, BLOCKING), ("2.5", NON_BLOCKING, NON_BLOCKING), ("3.1", None, BLOCKING),
    ("3.8", None, NON_BLOCKING), ("3.8", BLOCKING, BLOCKING), ("3.8-thinking", None, NON_BLOCKING),
])
async def test_a_call_takes_its_declared_mode_or_the_generations_default(
        profile: str, behavior: str | None, mode: str) -> None:
    """And a handle is issued while only NON_BLOCKING calls are open, never while a BLOCKING
    call is."""
    script = Script([ToolCall([Call("c1", "lookup_order")]), ResumptionUpdate()], reply=())
    async with LocalLiveServer(script) as server, connect(server, profile, behavior=behavior) as session:
        messages = await receive_until(session, lambda m: m.session_resumption_update is not None)
    update = messages[-1].session_resumption_update
    assert server.connections[0].state.modes == {"c1": mode}
    assert update.resumable is (mode == NON_BLOCKING)
    if mode == NON_BLOCKING:
        assert server.handles[update.new_handle].state.outstanding() == ["c1"]
    server.assert_clean()


async def test_intermediate_results_keep_a_non_blocking_call_open_until_will_continue_false() -> None:
    script = Script(
        [ToolCall([Call("c1", "lookup_order")]), WaitIntermediate("c1", count=2),
         OutputTranscript("two updates in"), WaitToolResponse("c1"), Audio(chunks=1),
         TurnComplete()],
        reply=(), resumption_after_turn=False,
    )
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        connection = server.connections[0]
        await session.send_tool_response(function_responses=response(
            "c1", will_continue=True, scheduling="SILENT", step=1))
        await server.wait_until(lambda: connection.state.intermediates.get("c1"))
        assert connection.state.outstanding() == ["c1"]
        assert connection.state.spoken == [], "one intermediate must not satisfy a wait for two"
        await session.send_tool_response(function_responses=response(
            "c1", will_continue=True, scheduling="SILENT", step=2))
        await receive_until(session, lambda m: bool(
            m.server_content and m.server_content.output_transcription))
        await asyncio.sleep(0.05)
        last = connection.sent[-1].message["serverContent"]
        assert "outputTranscription" in last, "the script goes on only with the final result"
        await session.send_tool_response(function_responses=response(
            "c1", will_continue=False, scheduling="WHEN_IDLE", status="shipped"))
        await receive_until(session, turn_complete)
    server.assert_clean()
    state = connection.state
    assert [r.response for r in state.intermediates["c1"]] == [{"step": 1}, {"step": 2}]
    assert state.results["c1"].response == {"status": "shipped"}
    assert state.outstanding() == [] and state.is_closed("c1")
    recorded = [(r.final, r.will_continue, r.scheduling) for r in connection.results]
    assert recorded == [(False, True, "SILENT"), (False, True, "SILENT"), (True, False, "WHEN_IDLE")]


async def test_responses_after_a_non_blocking_call_closed_are_flagged() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")])], reply=())
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response("c1", will_continue=False))
        await session.send_tool_response(function_responses=response("c1", will_continue=True, step=3))
        await session.send_tool_response(function_responses=response("c1", will_continue=False))
        await server.wait_until(lambda: len(server.violations) == 2)
    assert [(v["kind"], v["id"]) for v in server.violations] == [
        ("response_after_close", "c1"), ("duplicate_tool_response", "c1")]
    assert [r.accepted for r in server.connections[0].results] == [True, False, False]


async def test_a_repeated_intermediate_result_is_flagged() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")])], reply=())
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        for step in (1, 1, 2):
            await session.send_tool_response(function_responses=response("c1", will_continue=True,
                                                                         step=step))
        await server.wait_until(lambda: len(server.connections[0].results) == 3)
    assert [(v["kind"], v["id"]) for v in server.violations] == [("duplicate_intermediate", "c1")]
    assert [r.response for r in server.connections[0].state.intermediates["c1"]] == [
        {"step": 1}, {"step": 2}]


async def test_a_non_blocking_response_must_say_will_continue() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")])], reply=())
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response("c1"))
        await server.wait_until(lambda: server.violations)
    assert kinds(server) == ["will_continue_unset"]
    assert server.connections[0].state.is_closed("c1"), "taken as closing"


async def test_will_continue_on_a_blocking_call_is_flagged_and_ignored() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")])], reply=())
    async with LocalLiveServer(script) as server, connect(server, "2.5") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response("c1", will_continue=True))
        await server.wait_until(lambda: server.violations)
    assert kinds(server) == ["will_continue_on_blocking_call"]
    [result] = server.connections[0].results
    assert (result.final, result.accepted) == (True, True)
    assert server.connections[0].state.outstanding() == []


async def test_scheduling_written_only_inside_the_response_is_recorded() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order"), Call("c2", "lookup_order")])], reply=())
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response("c1", will_continue=False))
        await session._ws.send(
            '{"tool_response": {"functionResponses": [{"id": "c2", "name": "lookup_order", '
            '"willContinue": false, "response": {"status": "ok", "scheduling": "INTERRUPT"}}]}}')
        await server.wait_until(lambda: len(server.connections[0].results) == 2)
    first, second = server.connections[0].results
    assert first.scheduling is None and second.scheduling == "INTERRUPT"
    server.assert_clean()


@pytest.mark.parametrize(("will_continue", "scheduling", "replied"), [
    (True, "WHEN_IDLE", False), (False, "SILENT", False), (False, "WHEN_IDLE", True),
])
async def test_the_reply_trigger_fires_on_a_final_result_that_asks_for_one(
        will_continue: bool, scheduling: str, replied: bool) -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")])],
                    reply=[OutputTranscript("answered"), TurnComplete()],
                    resumption_after_turn=False)
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response(
            "c1", will_continue=will_continue, scheduling=scheduling))
        connection = server.connections[0]
        await server.wait_until(lambda: connection.results)
        await asyncio.sleep(0.2)
    assert (connection.state.spoken == ["answered"]) is replied
    server.assert_clean()


async def test_wait_tool_response_waits_for_the_final_result_not_an_intermediate() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")]), WaitToolResponse("c1", timeout=0.3),
                     OutputTranscript("went on")], reply=())
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response("c1", will_continue=True))
        await server.wait_until(lambda: server.violations)
    assert kinds(server) == ["wait_timeout"]
    assert server.connections[0].state.spoken == []


# --- results and progress as realtime text -------------------------------------------------------


async def test_results_and_progress_as_realtime_text_reach_a_resumed_session_once() -> None:
    """A session resumed from a handle older than a NON_BLOCKING call learns its progress and
    result as text; the same text again is flagged, and so is progress after the result."""
    first = Script([ResumptionUpdate(), ToolCall([Call("c1", "lookup_order")])], reply=())
    second = Script([WaitIntermediate("c1"), OutputTranscript("progress heard"),
                     WaitToolResponse("c1"), OutputTranscript("result heard")], reply=())
    progress = '[Function lookup_order (call_id c1) reported progress {"step": 1}]'
    result = '[Function lookup_order (call_id c1) returned {"status": "shipped"}]'
    async with LocalLiveServer([first, second]) as server:
        async with connect(server, "3.8") as session:
            messages = await receive_until(session, lambda m: m.tool_call is not None)
        handle = messages[0].session_resumption_update.new_handle
        async with connect(server, "3.8", session_resumption=resume(handle)) as session:
            resumed = await server.wait_for_connection(1)
            assert "c1" not in resumed.state.issued
            for text in (progress, progress, result, result, progress):
                await session.send_realtime_input(text=text)
            await server.wait_until(lambda: len(resumed.results) == 5)
            await server.wait_until(lambda: resumed.state.spoken == ["progress heard", "result heard"])
    assert [(v["kind"], v["id"]) for v in server.violations] == [
        ("duplicate_intermediate", "c1"), ("duplicate_tool_response", "c1"),
        ("response_after_close", "c1")]
    got = [(r.via, r.final, r.accepted) for r in resumed.results]
    assert got == [("realtime", False, True), ("realtime", False, False), ("realtime", True, True),
                   ("realtime", True, False), ("realtime", False, False)]
    assert resumed.state.conversation == [ConversationEntry("model", "progress heard", "spoken"),
                                          ConversationEntry("model", "result heard", "spoken")]


async def test_progress_as_content_counts_as_the_calls_intermediate() -> None:
    """On 2.5 (content any time): progress for a call the session does not know is taken in
    once, the same progress again is a duplicate, and progress after the result is late."""
    progress = '[Function lookup_order (call_id c9) reported progress {"step": 1}]'
    result = '[Function lookup_order (call_id c9) returned {"status": "shipped"}]'
    async with LocalLiveServer(Script(reply=())) as server:
        async with connect(server, "2.5", behavior=NON_BLOCKING) as session:
            for text in (progress, progress, result, progress):
                await session.send_client_content(turns=[text_turn(text)], turn_complete=True)
            await server.wait_until(lambda: len(server.connections[0].results) == 4)
    assert [(v["kind"], v["id"]) for v in server.violations] == [
        ("duplicate_intermediate", "c9"), ("response_after_close", "c9")]
    state = server.connections[0].state
    assert [r.response for r in state.intermediates["c9"]] == [{"step": 1}]
    assert state.results["c9"].response == {"status": "shipped"}
    assert state.conversation == [], "results and progress are not conversation text"


async def test_content_progress_for_a_call_the_session_waits_on_is_flagged() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")])], reply=())
    progress = '[Function lookup_order (call_id c1) reported progress {"step": 1}]'
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_realtime_input(text=progress)
        await server.wait_until(lambda: server.violations)
    assert kinds(server) == ["content_for_pending_call"]
    assert server.connections[0].state.intermediates == {}


async def test_a_result_as_realtime_text_is_acted_on_at_once() -> None:
    script = Script([WaitToolResponse("c1", timeout=3), OutputTranscript("done")], reply=())
    text = '[Function lookup_order (call_id c1) returned {"status": "shipped"}]'
    async with LocalLiveServer(script) as server, connect(server, "3.1") as session:
        await session.send_realtime_input(text=text)
        messages = await receive_until(session, lambda m: bool(
            m.server_content and m.server_content.output_transcription))
    assert messages[-1].server_content.output_transcription.text == "done"
    server.assert_clean()


# --- the conversation in the model state ---------------------------------------------------------


async def test_the_conversation_is_snapshotted_with_handles() -> None:
    first = Script([WaitSignal("go"), InputTranscript("Where is my order?"),
                    OutputTranscript("Let me look."),
                    TurnComplete(), ResumptionUpdate()], reply=(), resumption_after_turn=False)
    async with LocalLiveServer([first, Script(reply=())]) as server:
        async with connect(server, "2.5") as session:
            await session.send_client_content(turns=[text_turn("seeded"), text_turn(" ")],
                                              turn_complete=False)
            await server.wait_until(lambda: server.connections[0].state.conversation)
            server.signal("go")
            messages = await receive_until(session, has_handle)
            await session.send_realtime_input(text="after the handle")
            await session.send_realtime_input(text=" ")  # pipecat's nudge is no turn
            await server.wait_until(lambda: len(server.connections[0].received) == 4)
        handle = messages[-1].session_resumption_update.new_handle
        async with connect(server, "2.5", session_resumption=resume(handle)):
            resumed = await server.wait_for_connection(1)
    expected = [ConversationEntry("user", "seeded", "content"),
                ConversationEntry("user", "Where is my order?", "heard"),
                ConversationEntry("model", "Let me look.", "spoken")]
    assert resumed.state.conversation == expected
    assert server.connections[0].state.conversation == [
        *expected, ConversationEntry("user", "after the handle", "realtime")]
    assert resumed.to_json()["state"]["conversation"][1] == {
        "role": "user", "text": "Where is my order?", "how": "heard"}
    server.assert_clean()


# --- thinking: interactionStatus -----------------------------------------------------------------


def statuses(messages: list[types.LiveServerMessage]) -> list[tuple[str, str | None]]:
    """(what the message is, its interaction status as google-genai parsed it)."""
    shown = []
    for message in messages:
        content = message.server_content
        if message.tool_call:
            shown.append(("toolCall", None))
        elif content is not None:
            what = ("turnComplete" if content.turn_complete else
                    "transcript" if content.output_transcription else
                    "audio" if content.model_turn else "status")
            status = content.interaction_status
            shown.append((what, status.value if status is not None else None))
    return shown


def idle(message: types.LiveServerMessage) -> bool:
    content = message.server_content
    return bool(content and content.interaction_status == types.InteractionStatus.IDLE)


async def test_thinking_reports_in_progress_until_idle_and_calls_may_follow_turn_complete() -> None:
    script = Script([Audio(chunks=1), TurnComplete(), ToolCall([Call("c1", "lookup_order")]),
                     WaitToolResponse("c1"), OutputTranscript("shipped"), TurnComplete()],
                    reply=(), resumption_after_turn=False)
    async with LocalLiveServer(script) as server, connect(server, "3.8-thinking") as session:
        messages = await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response("c1", will_continue=False))
        messages += await receive_until(session, idle)
        await asyncio.sleep(0.1)
    assert statuses(messages) == [
        ("audio", "IN_PROGRESS"), ("turnComplete", "IN_PROGRESS"), ("toolCall", None),
        ("transcript", "IN_PROGRESS"), ("turnComplete", "IN_PROGRESS"), ("status", "IDLE")]
    assert server.connections[0].sent_kinds().count("serverContent") == 5, "IDLE is sent once"
    server.assert_clean()


async def test_thinking_stays_in_progress_while_a_call_is_open_after_the_turn() -> None:
    """A NON_BLOCKING call open past turnComplete keeps the session busy; its final result
    (answered by the script's reply) makes it idle."""
    script = Script([ToolCall([Call("c1", "lookup_order")]), Audio(chunks=1), TurnComplete()],
                    reply=[OutputTranscript("here it is"), TurnComplete()],
                    resumption_after_turn=False)
    async with LocalLiveServer(script) as server, connect(server, "3.8-thinking") as session:
        messages = await receive_until(session, turn_complete)
        await asyncio.sleep(0.1)
        assert not any(idle(m) for m in messages)
        assert server.connections[0].sent_kinds()[-1] == "serverContent"
        await asyncio.sleep(0.2)
        assert "IDLE" not in str(server.connections[0].sent[-1].message), "the call is still open"
        await session.send_tool_response(function_responses=response("c1", will_continue=False))
        messages += await receive_until(session, idle)
    assert statuses(messages)[-3:] == [("transcript", "IN_PROGRESS"),
                                        ("turnComplete", "IN_PROGRESS"), ("status", "IDLE")]
    server.assert_clean()


async def test_thinking_goes_idle_when_the_last_call_closes_with_no_reply() -> None:
    """No reply follows the result: the session still has to say it is idle."""
    script = Script([ToolCall([Call("c1", "lookup_order")])], reply=(), resumption_after_turn=False)
    async with LocalLiveServer(script) as server, connect(server, "3.8-thinking") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response(
            "c1", will_continue=False))
        [message] = await receive_until(session, idle)
    assert server.connections[0].sent_kinds() == ["setupComplete", "toolCall", "serverContent"]
    server.assert_clean()


async def test_status_is_only_on_thinking_and_a_script_can_send_one_explicitly() -> None:
    script = Script([Audio(chunks=1), TurnComplete(), InteractionStatus("IN_PROGRESS")],
                    reply=(), resumption_after_turn=False)
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        messages = await receive_until(session, lambda m: bool(
            m.server_content and m.server_content.interaction_status))
    assert statuses(messages) == [("audio", None), ("turnComplete", None), ("status", "IN_PROGRESS")]


# --- contextUpdate -------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["2.5", "3.1"])
async def test_context_update_is_refused_where_unsupported(profile: str) -> None:
    async with LocalLiveServer(Script(reply=())) as server, connect(server, profile) as session:
        await session.send_context_update(system_instruction="New prompt.")
        assert await close_code(session) == INVALID
    assert kinds(server) == ["context_update_unsupported"]
    assert server.connections[0].state.system_instruction == "You are a shop assistant."


@pytest.mark.parametrize("profile", ["3.8", "3.8-thinking"])
async def test_context_update_replaces_the_prompt_and_tools_and_a_reapply_shows(profile: str) -> None:
    refund = lookup_tool(name="refund")
    async with LocalLiveServer(Script(reply=())) as server, connect(server, profile) as session:
        connection = await server.wait_for_connection(0)
        assert connection.state.system_instruction == "You are a shop assistant."
        await session.send_context_update(system_instruction="New prompt.")
        await session.send_context_update(tools=[refund])
        await session.send_context_update(system_instruction="New prompt.")
        await session.send_context_update(tools=[])
        await server.wait_until(lambda: len(connection.state.context_updates) == 4)
    state = connection.state
    assert (state.system_instruction, state.tool_names) == ("New prompt.", [])
    assert [{k: v for k, v in update.items() if k in ("system_instruction", "tool_names")}
            for update in state.context_updates] == [
        {"system_instruction": "New prompt."}, {"tool_names": ["refund"]},
        {"system_instruction": "New prompt."}, {"tool_names": []}]
    assert connection.system_instruction == "You are a shop assistant.", "the setup as sent"
    server.assert_clean()


async def test_a_blocking_declaration_in_a_context_update_is_refused_on_thinking() -> None:
    async with LocalLiveServer(Script(reply=())) as server, connect(server, "3.8-thinking") as session:
        await session.send_context_update(tools=[lookup_tool(BLOCKING)])
        assert await close_code(session) == INVALID
    assert kinds(server) == ["blocking_unsupported"]
    assert server.connections[0].state.context_updates == []


async def test_a_call_issued_after_a_context_update_takes_the_new_declaration() -> None:
    script = Script([WaitFor("context_update"), ToolCall([Call("c1", "lookup_order")])], reply=())
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await session.send_context_update(tools=[lookup_tool(BLOCKING)])
        await receive_until(session, lambda m: m.tool_call is not None)
    assert server.connections[0].state.modes == {"c1": BLOCKING}


# --- a resumed NON_BLOCKING call and CancelToolCalls ---------------------------------------------


async def test_a_cancelled_non_blocking_call_takes_no_more_progress() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")]), WaitIntermediate("c1"),
                     CancelToolCalls("c1")], reply=())
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response("c1", will_continue=True))
        await receive_until(session, lambda m: m.tool_call_cancellation is not None)
        await session.send_tool_response(function_responses=response("c1", will_continue=True, n=2))
        await server.wait_until(lambda: server.violations)
    assert kinds(server) == ["response_for_cancelled_call"]
    assert server.connections[0].state.is_closed("c1")


@pytest.mark.parametrize("scheduling, where", [("SILENT", "field"), ("WHEN_IDLE", "response")])
async def test_thinking_refuses_a_scheduled_response_and_flags_an_intermediate_one(
        scheduling, where) -> None:
    """openclaw/openclaw PR 152413: 3.8 thinking closes 1007 on `scheduling` (the field or
    pipecat's copy inside the response) and abandons a call after an interim result."""
    script = Script([ToolCall([Call("c1", "lookup_order"), Call("c2", "lookup_order")])],
                    reply=(), resumption_after_turn=False)
    async with LocalLiveServer(script) as server, connect(server, "3.8-thinking") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response("c2", will_continue=True))
        await asyncio.sleep(0.2)
        assert [v["kind"] for v in server.violations] == ["intermediate_unsupported"]
        message = response("c1", will_continue=False,
                           **({"scheduling": scheduling} if where == "field" else {}))
        if where == "response":
            message = types.FunctionResponse(id="c1", name="lookup_order",
                                             response={"ok": True, "scheduling": scheduling},
                                             will_continue=False)
        await session.send_tool_response(function_responses=message)
        await server.wait_for_close(0)
    assert server.connections[0].close_code == 1007
    assert [v["kind"] for v in server.violations] == ["intermediate_unsupported",
                                                      "scheduling_unsupported"]
    # A plain final response is fine there (tested above); on 3.8 the field is taken.
    async with LocalLiveServer(script) as server, connect(server, "3.8") as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=response(
            "c1", will_continue=False, scheduling="SILENT"))
        await session.send_tool_response(function_responses=response("c2", will_continue=True))
        await asyncio.sleep(0.2)
    server.assert_clean()
