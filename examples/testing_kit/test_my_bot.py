"""Testing a Gemini Live bot offline with the local server (docs/testing-kit.md).

Copy this file next to your bot's tests. It needs `pytest` and `pytest-asyncio`, and nothing
in your project's pytest configuration: its tests are marked `asyncio`, so they run in
pytest-asyncio's default (strict) mode as well as under `asyncio_mode = "auto"`.
`examples/testing_kit/check_out_of_tree.py` checks exactly that, in a fresh project that
installs this package from a wheel.

`answer_one_turn` stands for your bot: it talks to Gemini Live through the real google-genai
client, which the server's `http_options()` points at 127.0.0.1 over TLS. Each test scripts what the model says and asks for, lets the
bot run, and asserts on what the server received from it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest
from google import genai
from google.genai import types

from service.local_live import (
    Call,
    LocalLiveServer,
    OutputTranscript,
    Script,
    ToolCall,
    TurnComplete,
    WaitToolResponse,
)

# Every test here is a coroutine: marked, so no `asyncio_mode` setting is needed.
pytestmark = pytest.mark.asyncio

MODEL = "gemini-2.5-flash-native-audio-preview-09-2025"
LOOKUP_ORDER = types.FunctionDeclaration(
    name="lookup_order",
    description="Where an order is.",
    parameters=types.Schema(type=types.Type.OBJECT,
                            properties={"order_id": types.Schema(type=types.Type.INTEGER)}),
)


# --- the bot under test (yours goes here) ----------------------------------------------

def lookup_order(args: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": args.get("order_id"), "status": "shipped"}


TOOLS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"lookup_order": lookup_order}


async def answer_one_turn(client: genai.Client, model: str, question: str) -> list[str]:
    """Ask one question, run every tool the model calls, return what the model said."""
    config = types.LiveConnectConfig(
        response_modalities=[types.Modality.AUDIO],
        system_instruction="You are a shop assistant.",
        tools=[types.Tool(function_declarations=[LOOKUP_ORDER])],
        output_audio_transcription=types.AudioTranscriptionConfig(),
    )
    said: list[str] = []
    async with client.aio.live.connect(model=model, config=config) as session:
        await session.send_realtime_input(text=question)
        while True:
            async for message in session.receive():
                if message.tool_call:
                    await session.send_tool_response(function_responses=[
                        types.FunctionResponse(id=call.id, name=call.name,
                                               response=TOOLS[call.name](call.args or {}))
                        for call in message.tool_call.function_calls or []
                    ])
                content = message.server_content
                if content and content.output_transcription:
                    said.append(content.output_transcription.text or "")
                if content and content.turn_complete and said:
                    return said


# --- the tests -------------------------------------------------------------------------

def checks_an_order() -> Script:
    """The model speaks, asks for one order, waits for its result, then answers."""
    return Script(
        [
            OutputTranscript("Let me look that up."),
            ToolCall([Call("call-1", "lookup_order", {"order_id": 7})]),
            WaitToolResponse(["call-1"]),
            OutputTranscript("Order 7 has shipped."),
            TurnComplete(),
        ],
        reply=(),  # the turn above is all the model says
    )


@pytest.mark.parametrize("profile", ["2.5", "3.1"])
async def test_the_bot_answers_the_tool_call_once(profile: str) -> None:
    # `profile` holds the server to one model generation's wire rules whatever model the
    # bot names; without it, each connection follows the generation of its setup's model.
    async with LocalLiveServer(checks_an_order(), profile=profile) as server:
        client = genai.Client(api_key="any-key", http_options=server.http_options())
        said = await asyncio.wait_for(answer_one_turn(client, MODEL, "Where is order 7?"), 10)

    assert said == ["Let me look that up.", "Order 7 has shipped."]
    [result] = server.tool_responses()
    assert (result.id, result.name, result.accepted) == ("call-1", "lookup_order", True)
    assert result.response == {"order_id": 7, "status": "shipped"}
    # Nothing the bot sent broke a rule of the Live API (duplicates, unknown ids, refused
    # messages): the server lists every breach it saw otherwise.
    server.assert_clean()


async def test_the_record_shows_what_the_bot_sent() -> None:
    async with LocalLiveServer(checks_an_order()) as server:
        client = genai.Client(api_key="any-key", http_options=server.http_options())
        await asyncio.wait_for(answer_one_turn(client, MODEL, "Where is order 7?"), 10)

    [connection] = server.connections
    assert connection.profile == "2.5"
    assert connection.system_instruction == "You are a shop assistant."
    assert connection.tool_names == ["lookup_order"]
    [question] = connection.messages("realtime_input")
    assert question.body == {"text": "Where is order 7?"}
    assert connection.sent_kinds()[:2] == ["setupComplete", "serverContent"]


async def test_an_answer_sent_twice_is_caught() -> None:
    # A bot that answers one call twice: the model would hear the result twice.
    script = Script([ToolCall([Call("call-1", "lookup_order", {"order_id": 7})])], reply=())
    async with LocalLiveServer(script) as server:
        client = genai.Client(api_key="any-key", http_options=server.http_options())
        config = types.LiveConnectConfig(
            response_modalities=[types.Modality.AUDIO],
            tools=[types.Tool(function_declarations=[LOOKUP_ORDER])],
        )
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            async for message in session.receive():
                if message.tool_call:
                    break
            answer = types.FunctionResponse(id="call-1", name="lookup_order",
                                            response={"status": "shipped"})
            await session.send_tool_response(function_responses=[answer])
            await session.send_tool_response(function_responses=[answer])
            await server.wait_until(lambda: len(server.tool_responses()) == 2)

    assert [v["kind"] for v in server.violations] == ["duplicate_tool_response"]
    with pytest.raises(AssertionError, match="duplicate_tool_response"):
        server.assert_clean()
