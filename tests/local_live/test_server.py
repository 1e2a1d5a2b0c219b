"""The local Gemini Live server, driven by the real google-genai client.

Every test talks to the server through ``client.aio.live.connect`` exactly as Pipecat
does, so a change in the SDK's wire format shows up here first.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import websockets
from google import genai
from google.genai import errors, types

from service.local_live import (
    Audio,
    Call,
    CancelToolCalls,
    Close,
    DROP_SETUP,
    HANDLE_REFUSED,
    Drop,
    GoAway,
    LocalLiveServer,
    OutputTranscript,
    Raw,
    ResumptionUpdate,
    Script,
    Sleep,
    ToolCall,
    TurnComplete,
    WaitFor,
    WaitSignal,
    WaitToolResponse,
    http_options,
)
from tests.local_live.helpers import receive_until, turn_complete

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MODEL = "gemini-2.5-flash-native-audio-preview-09-2025"
LOOKUP = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="lookup_order",
            description="Find an order.",
            parameters=types.Schema(
                type=types.Type.OBJECT,
                properties={"orderId": types.Schema(type=types.Type.INTEGER)},
            ),
        )
    ]
)


def live_config(**overrides: Any) -> types.LiveConnectConfig:
    config = {
        "response_modalities": [types.Modality.AUDIO],
        "system_instruction": "You are a shop assistant.",
        "tools": [LOOKUP],
        "session_resumption": types.SessionResumptionConfig(),
    }
    config.update(overrides)
    return types.LiveConnectConfig(**config)


def connect(server: LocalLiveServer, **overrides: Any):
    client = genai.Client(api_key="test-key", http_options=server.http_options())
    return client.aio.live.connect(model=MODEL, config=live_config(**overrides))


def answer(call_id: str, name: str = "lookup_order", **response: Any) -> types.FunctionResponse:
    return types.FunctionResponse(id=call_id, name=name, response=response or {"status": "shipped"})


async def test_setup_is_answered_and_recorded() -> None:
    async with LocalLiveServer() as server, connect(server) as session:
        assert session.setup_complete is not None
        connection = await server.wait_for_connection(0)
    assert server.base_url.startswith("https://127.0.0.1:") and not server.base_url.endswith("/")
    assert connection.path.startswith(
        "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
    )
    assert connection.model == f"models/{MODEL}"
    assert connection.system_instruction == "You are a shop assistant."
    assert connection.tool_names == ["lookup_order"]
    assert connection.wants_resumption and connection.resumption_handle is None
    assert connection.sent_kinds()[0] == "setupComplete"
    server.assert_clean()


async def test_audio_transcript_and_turn_complete_reach_the_client() -> None:
    script = Script([Audio(chunks=3, chunk_ms=20), OutputTranscript("Hello!"), TurnComplete()])
    async with LocalLiveServer(script) as server, connect(server) as session:
        messages = await receive_until(session, turn_complete)
    audio = [message.data for message in messages if message.data]
    assert [len(chunk) for chunk in audio] == [960, 960, 960]
    assert messages[-2].server_content.output_transcription.text == "Hello!"
    assert turn_complete(messages[-1])
    server.assert_clean()


async def test_tool_response_is_recorded_and_answered_by_default() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order", {"orderId": 7})])])
    async with LocalLiveServer(script) as server, connect(server) as session:
        [message] = await receive_until(session, lambda m: m.tool_call is not None)
        call = message.tool_call.function_calls[0]
        assert (call.id, call.name, call.args) == ("c1", "lookup_order", {"orderId": 7})
        await session.send_tool_response(function_responses=answer("c1"))
        reply = await receive_until(session, turn_complete)
    assert sum(1 for message in reply if message.data) == 2
    [result] = server.tool_responses()
    assert (result.connection, result.id, result.name, result.via) == (0, "c1", "lookup_order", "tool_response")
    assert result.response == {"status": "shipped"} and result.accepted
    assert server.connections[0].state.outstanding() == []
    server.assert_clean()


async def test_parallel_calls_are_answered_once_all_results_are_in() -> None:
    script = Script(
        [
            ToolCall([Call("a", "lookup_order", {"orderId": 1}), Call("b", "lookup_order", {"orderId": 2})]),
            WaitToolResponse(["a", "b"]),
            Audio(chunks=1),
            TurnComplete(),
        ]
    )
    async with LocalLiveServer(script) as server, connect(server) as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=[answer("a")])
        await session.send_tool_response(function_responses=[answer("b")])
        await receive_until(session, turn_complete)
    assert [result.id for result in server.tool_responses()] == ["a", "b"]
    server.assert_clean()


async def test_duplicate_tool_response_is_flagged() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")])], reply=())
    async with LocalLiveServer(script) as server, connect(server) as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=answer("c1"))
        await session.send_tool_response(function_responses=answer("c1"))
        await server.wait_until(lambda: len(server.violations) == 1)
    [violation] = server.violations
    assert (violation["kind"], violation["connection"], violation["id"]) == (
        "duplicate_tool_response", 0, "c1",
    )
    assert [result.accepted for result in server.tool_responses()] == [True, False]
    with pytest.raises(AssertionError, match="duplicate_tool_response on connection 0"):
        server.assert_clean()


async def test_unknown_call_id_is_flagged_and_left_unanswered() -> None:
    async with LocalLiveServer(Script()) as server, connect(server) as session:
        await session.send_tool_response(function_responses=answer("never-issued"))
        await server.wait_until(lambda: server.violations_of("unknown_call_id"))
        await asyncio.sleep(0.1)
    assert server.connections[0].sent_kinds() == ["setupComplete"]
    assert server.violations[0]["id"] == "never-issued"


async def test_wrong_function_name_is_flagged() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")])], reply=())
    async with LocalLiveServer(script) as server, connect(server) as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        await session.send_tool_response(function_responses=answer("c1", name="tool_call_result"))
        await server.wait_until(lambda: server.violations)
    assert server.violations[0]["kind"] == "wrong_function_name"
    assert "lookup_order" in server.violations[0]["detail"]


async def test_cancellation_reaches_the_client_and_a_late_response_is_flagged() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")]), Sleep(0.05), CancelToolCalls("c1")])
    async with LocalLiveServer(script) as server, connect(server) as session:
        messages = await receive_until(session, lambda m: m.tool_call_cancellation is not None)
        assert messages[-1].tool_call_cancellation.ids == ["c1"]
        await session.send_tool_response(function_responses=answer("c1"))
        await server.wait_until(lambda: server.violations)
    assert server.violations[0]["kind"] == "response_for_cancelled_call"
    assert server.connections[0].state.outstanding() == []


async def test_no_resumable_handle_while_a_call_is_outstanding() -> None:
    script = Script(
        [
            ToolCall([Call("c1", "lookup_order")]),
            ResumptionUpdate(),
            ResumptionUpdate(resumable=True),
        ]
    )
    async with LocalLiveServer(script) as server, connect(server) as session:
        messages = await receive_until(
            session, lambda m: bool(m.session_resumption_update and m.session_resumption_update.new_handle)
        )
    refused, forced = [m.session_resumption_update for m in messages if m.session_resumption_update]
    assert (refused.resumable, refused.new_handle) == (False, None)
    assert forced.resumable is True and forced.new_handle in server.handles
    assert server.handles[forced.new_handle].state.outstanding() == ["c1"]


async def test_resumed_session_knows_results_sent_before_its_handle_only() -> None:
    first = Script(
        [
            ToolCall([Call("c1", "lookup_order", {"orderId": 1})]),
            WaitToolResponse("c1"),
            ResumptionUpdate(),
            ToolCall([Call("c2", "lookup_order", {"orderId": 2})]),
            WaitToolResponse("c2"),
            Close(1011, "server restart"),
        ]
    )
    async with LocalLiveServer([first, Script(reply=())]) as server:
        async with connect(server) as session:
            await receive_until(session, lambda m: m.tool_call is not None)
            await session.send_tool_response(function_responses=answer("c1"))
            messages = await receive_until(session, lambda m: m.tool_call is not None)
            [update] = [m.session_resumption_update for m in messages if m.session_resumption_update]
            await session.send_tool_response(function_responses=answer("c2", status="refunded"))
            with pytest.raises(errors.APIError):
                await receive_until(session, lambda m: False)
        handle = update.new_handle
        resumption = types.SessionResumptionConfig(handle=handle)
        async with connect(server, session_resumption=resumption) as session:
            resumed = await server.wait_for_connection(1)
            assert resumed.resumed_from == handle and resumed.resumption_handle == handle
            assert set(resumed.state.results) == {"c1"} and "c2" not in resumed.state.issued
            # The gap result: as a toolResponse the resumed model ignores it ...
            await session.send_tool_response(function_responses=answer("c2", status="refunded"))
            # ... as conversation content it lands, once; c1 again is a duplicate.
            gap = '[Function lookup_order returned {"status": "refunded"}]'
            again = '[Function lookup_order returned {"status": "shipped"}]'
            await session.send_client_content(
                turns=[types.Content(role="user", parts=[types.Part(text=gap), types.Part(text=again)])],
                turn_complete=False,
            )
            await server.wait_until(lambda: len(resumed.results) == 3)
    assert [v["kind"] for v in server.violations] == ["unknown_call_id", "duplicate_tool_response"]
    assert server.connections[0].close_code == 1011 and server.connections[0].closed_by == "server"
    via = [(r.connection, r.via, r.accepted) for r in server.tool_responses()]
    assert via == [
        (0, "tool_response", True),
        (0, "tool_response", True),
        (1, "tool_response", False),
        (1, "content", True),
        (1, "content", False),
    ]


async def test_seeded_history_in_a_fresh_session_is_not_a_duplicate() -> None:
    seed = [
        types.Content(role="user", parts=[types.Part(text="Where is order 7?")]),
        types.Content(role="model", parts=[types.Part(text='[Called function lookup_order with args {"orderId": 7}]')]),
        types.Content(role="user", parts=[types.Part(text='[Function lookup_order returned {"status": "shipped"}]')]),
    ]
    async with LocalLiveServer(Script(reply=())) as server, connect(server) as session:
        await session.send_client_content(turns=seed, turn_complete=False)
        await session.send_client_content(turns=seed[2:], turn_complete=True)
        await server.wait_until(lambda: len(server.tool_responses()) == 2)
    first, second = server.tool_responses()
    assert (first.via, first.id, first.accepted, first.response) == ("content", None, True, {"status": "shipped"})
    assert not second.accepted
    assert [v["kind"] for v in server.violations] == ["duplicate_tool_response"]


async def test_content_does_not_answer_a_call_the_session_waits_for() -> None:
    """In the bidi API a pending function call is answered by a ``toolResponse`` only:
    "FunctionResponse objects are matched to the respective FunctionCall objects by the id
    field ... in the bidi GenerateContent APIs function calling happens over this
    dedicated set of messages" (google-genai, LiveClientToolResponse). A result written
    into the conversation, as a functionResponse part or as pipecat's text (with the id or
    without), leaves the call open and the model waiting. The server took it as the
    answer, so a service sending every result as content passed the whole crash suite."""
    script = Script([ToolCall([Call("c1", "lookup_order")]),
                     WaitToolResponse("c1", timeout=5), Audio(chunks=1), TurnComplete()],
                    reply=(), resumption_after_turn=False)
    part = types.Part(function_response=answer("c1", status="late"))
    with_id = '[Function lookup_order (call_id c1) returned {"status": "late"}]'
    without_id = '[Function lookup_order returned {"status": "late"}]'
    async with LocalLiveServer(script) as server, connect(server) as session:
        await receive_until(session, lambda m: m.tool_call is not None)
        for content in (types.Part(text=without_id), part, types.Part(text=with_id)):
            await session.send_client_content(turns=[types.Content(role="user", parts=[content])])
        connection = server.connections[0]
        await server.wait_until(lambda: len(connection.results) == 3)
        await asyncio.sleep(0.2)
        assert connection.state.outstanding() == ["c1"]
        assert connection.sent_kinds() == ["setupComplete", "toolCall"], "the model went on"
        await session.send_tool_response(function_responses=answer("c1", status="late"))
        await receive_until(session, turn_complete)
    got = [(r.via, r.id, r.accepted) for r in server.tool_responses()]
    assert got == [("content", None, True), ("content", "c1", False), ("content", "c1", False),
                   ("tool_response", "c1", True)]
    assert [(v["kind"], v["id"]) for v in server.violations] == [
        ("content_for_pending_call", "c1"), ("content_for_pending_call", "c1")]


async def test_go_away_reaches_the_client_then_the_server_closes() -> None:
    script = Script([GoAway(time_left=0.2, close_code=1000)])
    async with LocalLiveServer(script) as server, connect(server) as session:
        [message] = await receive_until(session, lambda m: m.go_away is not None)
        assert message.go_away.time_left == "0.2s"  # a raw Duration string, not a timedelta
        with pytest.raises(errors.APIError) as closed:
            await receive_until(session, lambda m: False)
    assert closed.value.code == 1000
    assert server.connections[0].close_code == 1000


async def test_close_1011_after_a_tool_call() -> None:
    script = Script([ToolCall([Call("c1", "lookup_order")]), Close(1011, "internal error")])
    async with LocalLiveServer(script) as server, connect(server) as session:
        with pytest.raises(errors.APIError) as closed:
            await receive_until(session, lambda m: False)
        connection = await server.wait_for_close(0)
    assert closed.value.code == 1011
    assert (connection.close_code, connection.closed_by) == (1011, "server")
    assert connection.state.outstanding() == ["c1"]


async def test_drop_aborts_without_a_close_frame() -> None:
    async with LocalLiveServer(Script([Audio(chunks=1), Drop()])) as server, connect(server) as session:
        with pytest.raises(errors.APIError) as dropped:
            await receive_until(session, lambda m: False)
        connection = await server.wait_for_close(0)
    assert dropped.value.code == 1006
    assert (connection.close_code, connection.closed_by) == (1006, "abnormal")


async def test_setup_complete_can_be_delayed_or_refused() -> None:
    async with LocalLiveServer([Script(setup_delay=0.3), Script(refuse_setup=1011)]) as server:
        started = time.monotonic()
        async with connect(server) as session:
            assert session.setup_complete is not None
            assert time.monotonic() - started >= 0.3
        with pytest.raises(errors.APIError) as refused:
            async with connect(server):
                pass
    assert refused.value.code == 1011
    assert server.connections[1].sent == []


async def test_setup_refused_as_a_handle_is_or_dropped_before_setup_complete() -> None:
    """The two handshake failures a client must tell apart: the API's refusal of the setup
    (a client-error close code, with its reason) and a network failure (no close frame)."""
    scripts = [Script.refusing_handle(), Script(refuse_setup=DROP_SETUP)]
    async with LocalLiveServer(scripts) as server:
        with pytest.raises(errors.APIError) as refused:
            async with connect(server):
                pass
        with pytest.raises(errors.APIError) as dropped:
            async with connect(server):
                pass
        await server.wait_for_close(1)
    assert (refused.value.code, HANDLE_REFUSED[1] in str(refused.value)) == (
        HANDLE_REFUSED[0], True)
    assert dropped.value.code == 1006
    assert server.connections[1].closed_by == "abnormal"


async def test_malformed_client_message_is_recorded_and_the_session_goes_on() -> None:
    script = Script([WaitFor("realtime_input"), Audio(chunks=1), TurnComplete()])
    async with LocalLiveServer(script) as server, connect(server) as session:
        await session._ws.send("{not json")
        await session._ws.send('{"tool_response": {"functionResponses": ["not an object"]}}')
        await session.send_realtime_input(text="hello")
        await receive_until(session, turn_complete)
    assert [v["kind"] for v in server.violations] == ["malformed_client_message"] * 2
    kinds = [m.kind for m in server.connections[0].received]
    assert kinds == ["setup", "malformed", "tool_response", "realtime_input"]
    assert server.connections[0].received[3].body == {"text": "hello"}
    assert server.errors == []


async def test_raw_unknown_server_message_makes_the_client_raise() -> None:
    # google-genai 2.34 tries APIError.raise_error(message.get("code"), ...): with no
    # "code" key that comparison itself fails, so the client sees a TypeError.
    unknown = Raw('{"somethingNew": {}}')
    with_code = Raw('{"code": 503, "message": "overloaded"}')
    async with LocalLiveServer([Script([unknown]), Script([with_code])]) as server:
        async with connect(server) as session:
            with pytest.raises(TypeError):
                await receive_until(session, lambda m: False)
        async with connect(server) as session:
            with pytest.raises(errors.ServerError) as raised:
                await receive_until(session, lambda m: False)
    assert raised.value.code == 503
    assert server.connections[0].sent[-1].message == '{"somethingNew": {}}'


async def test_signals_and_injected_steps_drive_a_live_connection() -> None:
    script = Script([WaitSignal("speak"), Audio(chunks=1), TurnComplete()], resumption_after_turn=False)
    async with LocalLiveServer(script) as server, connect(server) as session:
        await server.wait_for_connection(0)
        await asyncio.sleep(0.05)
        assert server.connections[0].sent_kinds() == ["setupComplete"]
        server.signal("speak")
        await receive_until(session, turn_complete)
        server.inject(0, [OutputTranscript("injected"), TurnComplete()])
        messages = await receive_until(session, turn_complete)
    assert messages[0].server_content.output_transcription.text == "injected"


async def test_required_wait_that_times_out_is_a_violation() -> None:
    script = Script([WaitToolResponse("c9", timeout=0.1), Audio(chunks=1)])
    async with LocalLiveServer(script) as server, connect(server):
        await server.wait_until(lambda: server.violations)
    assert server.violations[0]["kind"] == "wait_timeout"
    assert server.connections[0].sent_kinds() == ["setupComplete"]


async def test_killed_client_process_does_not_stop_the_server(tmp_path) -> None:
    child_code = """
import asyncio, json, ssl, sys, time
from websockets.asyncio.client import connect
async def main():
    ws = await connect(sys.argv[1], ssl=ssl.create_default_context(cafile=sys.argv[2]))
    await ws.send(json.dumps({"setup": {"model": "models/x"}}))
    await ws.recv()
    print("ready", flush=True)
    time.sleep(60)
asyncio.run(main())
"""
    async with LocalLiveServer([Script([ToolCall([Call("c1", "lookup_order")])]), Script()]) as server:
        url = server.base_url.replace("https", "wss") + "/ws/x.BidiGenerateContent?key=k"
        child = subprocess.Popen(
            [sys.executable, "-c", child_code, url, str(server.cert_path)],
            stdout=subprocess.PIPE, text=True,
        )
        try:
            line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 10)
            assert line.strip() == "ready"
        finally:
            child.kill()
            child.wait()
        killed = await server.wait_for_close(0)
        async with connect(server) as session:
            assert session.setup_complete is not None
        server.dump(tmp_path / "record.json")
    assert (killed.close_code, killed.closed_by) == (1006, "abnormal")
    record = json.loads((tmp_path / "record.json").read_text())
    assert [c["index"] for c in record["connections"]] == [0, 1]
    assert record["connections"][0]["state"]["issued"] == {"c1": "lookup_order"}
    server.assert_clean()


async def test_only_bidi_generate_content_paths_are_served() -> None:
    async with LocalLiveServer() as server:
        url = server.base_url.replace("https", "wss") + "/ws/somewhere.else"
        with pytest.raises(websockets.InvalidStatus):
            async with websockets.connect(url, ssl=server.ssl_client_context()):
                pass
    assert server.connections == []


async def test_standalone_process_serves_the_real_client(tmp_path) -> None:
    record = tmp_path / "record.json"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service.local_live", "--scenario", "speak", "--record", str(record),
        stdout=asyncio.subprocess.PIPE,
        cwd=PROJECT_ROOT,
    )
    try:
        ready = json.loads(await asyncio.wait_for(process.stdout.readline(), 10))
        client = genai.Client(api_key="k", http_options=http_options(ready["base_url"], ready["cert_path"]))
        async with client.aio.live.connect(model=MODEL, config=live_config()) as session:
            await receive_until(session, turn_complete)
    finally:
        process.terminate()
        await process.wait()
    dumped = json.loads(record.read_text())
    assert dumped["connections"][0]["closed_by"] == "client"
    assert dumped["violations"] == []


async def test_the_client_id_of_a_call_sent_without_id_is_remembered_for_duplicates() -> None:
    """A call sent without an id (Vertex) is answered under an id the client made up; the
    server takes it by name. That id then names the call: the same result again, as a
    toolResponse or as content (also on a session resumed after it), is a duplicate. It
    was taken as the answer of another open call of the same function, and accepted
    silently as content (its id unknown to the server), so a duplicated result of such a
    call never showed."""
    first = Script(
        [
            ToolCall([Call("a1", "lookup_order", {"orderId": 1}, omit=("id",)),
                      Call("a2", "lookup_order", {"orderId": 2}, omit=("id",))]),
            WaitToolResponse(["a1", "a2"]),
            TurnComplete(),
            Close(1011, "server restart"),
        ],
        reply=(),
    )
    async with LocalLiveServer([first, Script(reply=())]) as server:
        async with connect(server) as session:
            await receive_until(session, lambda m: m.tool_call is not None)
            await session.send_tool_response(function_responses=answer("made-up-1", status="one"))
            # The same answer again, while a2 is still open: not a2's answer.
            await session.send_tool_response(function_responses=answer("made-up-1", status="one"))
            await session.send_tool_response(function_responses=answer("made-up-2", status="two"))
            messages = await receive_until(
                session, lambda m: bool(m.session_resumption_update
                                        and m.session_resumption_update.new_handle))
            handle = messages[-1].session_resumption_update.new_handle
        resumption = types.SessionResumptionConfig(handle=handle)
        async with connect(server, session_resumption=resumption) as session:
            resumed = await server.wait_for_connection(1)
            again = '[Function lookup_order (call_id made-up-2) returned {"status": "two"}]'
            await session.send_client_content(
                turns=[types.Content(role="user", parts=[types.Part(text=again)])],
                turn_complete=False,
            )
            await server.wait_until(lambda: len(resumed.results) == 1)
    got = [(r.connection, r.id, r.via, r.accepted) for r in server.tool_responses()]
    assert got == [
        (0, "a1", "tool_response", True),
        (0, "a1", "tool_response", False),
        (0, "a2", "tool_response", True),
        (1, "a2", "content", False),
    ]
    assert [(v["kind"], v["connection"], v["id"]) for v in server.violations] == [
        ("duplicate_tool_response", 0, "a1"),
        ("duplicate_tool_response", 1, "a2"),
    ]


async def test_a_result_sent_as_content_counts_once_the_turn_is_complete() -> None:
    """clientContent with ``turnComplete: false`` only adds to the context: Gemini "will
    not return until you send turn_complete=True" (google-genai's send_client_content). A
    result sent that way is in the model (a second copy is a duplicate) but nothing asks
    the model to go on: a script waiting for it must not go on either. It did, so a service
    delivering results as content without completing the turn passed every wire test while
    the real model would sit silent."""
    script = Script([WaitToolResponse("c1", timeout=3), Audio(chunks=1), TurnComplete()],
                    reply=(), resumption_after_turn=False)
    text = '[Function lookup_order (call_id c1) returned {"status": "shipped"}]'
    async with LocalLiveServer(script) as server, connect(server) as session:
        await session.send_client_content(
            turns=[types.Content(role="user", parts=[types.Part(text=text)])], turn_complete=False)
        connection = await server.wait_for_connection(0)
        await server.wait_until(lambda: connection.results)
        await asyncio.sleep(0.3)
        assert connection.sent_kinds() == ["setupComplete"], "the model went on without a turn"
        assert "c1" in connection.state.results  # but the result is in its context
        await session.send_client_content(turn_complete=True)  # pipecat's _complete_turn
        await receive_until(session, turn_complete)
    server.assert_clean()
