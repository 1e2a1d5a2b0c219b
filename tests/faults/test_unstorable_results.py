"""A tool may return what JSON allows but the log cannot store: NaN (json.dumps writes it), a
lone surrogate (a str Python holds, UTF-8 refuses), a value nested deeper than the readers
walk. The call must still be answered once, the log must go on, every reader must read it.
The same for the app's opening context messages, which the service logs to seed from."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from service.local_live import Audio, Call, Script, ToolCall, TurnComplete, WaitToolResponse
from tests.faults.test_hostile_wire import (ALIVE, ORDER, alive_steps, assert_log_settled,
                                            drive_until_alive)
from tests.service import helpers
from tests.service.helpers import Flavour, assert_answered_once, assert_chain_ok, run_call

pytestmark = pytest.mark.timeout(180)


def nested(depth: int):
    value = "x"
    for i in range(depth):
        value = {"a": value} if i % 2 else [value]
    return value


HOSTILE_RESULTS = {
    "nan": {"total": float("nan")},
    "lone_surrogate": {"note": "caf\udce9"},
    "too_deep": {"tree": nested(900)},
}


@pytest.fixture
def flavour(store, backend) -> Flavour:
    return Flavour(backend.name, store)


@pytest.mark.parametrize("kind", sorted(HOSTILE_RESULTS))
async def test_a_result_the_log_cannot_store_is_answered_as_a_failure(flavour, kind,
                                                                       monkeypatch):
    real = helpers.make_tool

    def make_tool(name, ledger, delay, **options):
        if name != ORDER:
            return real(name, ledger, delay, **options)

        async def handler(params):
            ledger.write({"tool": name, "call_id": params.tool_call_id,
                          "args": params.arguments})
            await asyncio.sleep(delay)
            await params.result_callback(HOSTILE_RESULTS[kind])

        return handler

    monkeypatch.setattr(helpers, "make_tool", make_tool)
    scripts = [Script([Audio(chunks=2), TurnComplete(),
                       ToolCall(Call("h1", ORDER, {"id": 1})), WaitToolResponse("h1"),
                       *alive_steps()], reply=())]
    run = await run_call(flavour, scripts, drive_until_alive)

    answered = assert_answered_once(run, "h1", ORDER, via="tool_response", connection=0)
    assert "error" in answered.response, answered.response
    assert "cannot be stored" in answered.response["error"], answered.response
    (failed,) = run.find("tool.call_failed", call_id="h1")
    assert "cannot be stored" in failed.data["error"]
    assert_answered_once(run, ALIVE, "get_weather")
    assert_log_settled(run, Counter({"unstorable_event": 1}))
    await assert_chain_ok(run)
    for e in run.events:  # every reader can take every row
        json.dumps(e.data)


async def test_an_opening_message_the_log_cannot_store_is_an_anomaly_not_a_dead_call(flavour):
    """Text decoded with surrogateescape (a file name, a subprocess's output) holds lone
    surrogates: one such opening message must not keep the others, or the call, from the
    log."""
    messages = [{"role": "user", "content": "Hello, I am caf\udce9"},
                {"role": "user", "content": "Where is my order?"}]
    run = await run_call(flavour, [Script(alive_steps(), reply=())], drive_until_alive,
                         messages=messages)
    assert [e.data["text"] for e in run.find("conversation.message")][:1] == [
        "Where is my order?"]
    (unstorable,) = run.find("anomaly.recorded", kind="unstorable_event")
    assert unstorable.data["detail"]["type"] == "conversation.message"
    assert_answered_once(run, ALIVE, "get_weather")
    assert_log_settled(run, Counter({"unstorable_event": 1}))
    await assert_chain_ok(run)
