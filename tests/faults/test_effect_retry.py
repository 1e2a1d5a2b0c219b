"""The log refuses a write the service acts on, and nothing else happens in the call.

A real pipeline (DurableGeminiLiveLLMService, google-genai, the local Gemini Live server) on
a SQLite log made unwritable (`chattr +i`: every write fails, as on a failing disk) at the
moment that matters, then writable again. Nothing else comes along to retry for the service
(no audio, no tool call): what the log refused must still happen once it is back, exactly
once, and only after it is logged.

- A prompt change (`LLMUpdateSettingsFrame`) while the log is down: its observation used to be
  lost with the append's exception, and the new prompt never reached Gemini.
- A result's send intent refused on the session that should carry it: the state was left
  stale and nothing was due until the call observed something else; a model waiting for
  that result waited for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from loguru import logger
from pipecat.frames.frames import LLMUpdateSettingsFrame
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.local_live import (Audio, Call, Close, Script, Sleep, ToolCall, TurnComplete,
                                WaitSignal, WaitToolResponse)
from session_store.delivery import SendResult
from tests.service.helpers import (Ctl, Flavour, assert_answered_once, assert_chain_ok,
                                   assert_log_settled, assert_ran_once, assert_server_clean,
                                   run_call, migrated_sqlite)

from .sqlitefaults import Unwritable

pytestmark = pytest.mark.timeout(120)

ORDER = "lookup_order"
DOWN_S = 1.5  # how long the log stays unwritable
APPEND_TIMEOUT_S = 0.5  # an append gives up well within that


@pytest.fixture
async def unwritable_store(unwritable_dir):
    db = unwritable_dir / "log.db"
    async with migrated_sqlite(db, append_timeout=APPEND_TIMEOUT_S) as store:
        yield store, db


@contextlib.contextmanager
def error_log():
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(str(m)), level="ERROR")
    try:
        yield errors
    finally:
        logger.remove(sink)


async def test_prompt_change_while_the_log_is_down_reconnects_once_it_is_back(unwritable_store):
    store, db = unwritable_store
    scripts = [Script([Audio(chunks=2), TurnComplete(), WaitSignal("end", timeout=20,
                                                                   required=False)], reply=()),
               Script([Audio(chunks=2), TurnComplete()], reply=())]

    async def drive(ctl: Ctl) -> None:
        assert await ctl.wait(lambda: bool(ctl.tap.speech) and not ctl.tap.speaking,
                              timeout=10), "the first turn never ended"
        with Unwritable(db):
            await ctl.task.queue_frame(LLMUpdateSettingsFrame(
                delta=GeminiLiveLLMService.Settings(system_instruction="NEW")))
            await asyncio.sleep(DOWN_S)
            assert len(ctl.server.connections) == 1, "reconnected before the change was logged"
        assert await ctl.wait(lambda: len(ctl.server.connections) == 2, timeout=10), (
            "the prompt change made while the log was down never reconnected")
        ctl.server.signal("end")
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    with error_log() as errors:
        run = await run_call(Flavour("sqlite", store), scripts, drive)

    assert [c.system_instruction for c in run.connections] == ["Be brief.", "NEW"]
    assert any("StoreUnavailable" in e for e in errors), "the log never refused the change"
    changed = run.find("settings.changed")
    assert len(changed) == 1 and changed[0].data["keys"] == ["system_instruction"], (
        run.timeline())
    assert run.at("settings.changed") < run.at("connection.connected", generation=2)
    assert_server_clean(run)
    assert_log_settled(run)
    await assert_chain_ok(run)


async def test_send_refused_on_the_new_session_is_retried_without_anything_else_happening(
        unwritable_store):
    store, db = unwritable_store
    scripts = [
        Script([Audio(chunks=2), TurnComplete(), ToolCall(Call("c1", ORDER, {"id": 1})),
                Sleep(0.3), Close(1011, "internal error")], reply=()),
        # A slow handshake: the tool finishes while no session is open, so its result waits
        # for this session; then the model says nothing until it has the result.
        Script([WaitToolResponse("c1", timeout=20), Audio(chunks=2), TurnComplete()],
               setup_delay=1.0, reply=()),
    ]
    faulted: dict[str, float] = {}

    async def drive(ctl: Ctl) -> None:
        llm = ctl.llm
        perform_round = llm.effects.perform_round

        async def round_with_fault(kinds, *rest):
            # The real fault, at the one moment that matters: the send intent's append.
            if not faulted and any(isinstance(e, SendResult) for e in llm.driver.due()):
                fault = Unwritable(db).__enter__()
                faulted["down"] = time.time()
                loop = asyncio.get_running_loop()

                def lift() -> None:
                    faulted["up"] = time.time()  # (writes fail until chattr is done)
                    fault.__exit__(None, None, None)

                loop.call_later(DOWN_S, lift)
            return await perform_round(kinds, *rest)

        llm.effects.perform_round = round_with_fault
        assert await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking,
                              timeout=20), "the result never reached the new session"
        await ctl.settle()

    with error_log() as errors:
        run = await run_call(Flavour("sqlite", store), scripts, drive, tool_delay=0.6)

    assert "up" in faulted, "the send intent was never refused: the fault did not bite"
    assert any("could not perform what is due" in e for e in errors), errors
    assert len(run.connections) == 2
    assert_server_clean(run)
    result = assert_answered_once(run, "c1", ORDER, connection=1)
    assert result.at >= faulted["up"], (
        "the result went out before its send was logged")
    assert_ran_once(run, "c1")
    assert [e.data["generation"] for e in run.find("tool.result_sent", call_id="c1")] == [2]
    assert_log_settled(run)
    await assert_chain_ok(run)


async def test_a_session_lost_while_the_log_is_down_is_replaced_once_it_is_back(
        unwritable_store):
    """Gemini closes the session (1011) while the log cannot take the disconnect: the
    reconnect waits for the log instead of failing at its first append (which left the call
    without a session for good), then resumes with the newest handle, and the call goes on."""
    store, db = unwritable_store
    scripts = [
        Script([Audio(chunks=2), TurnComplete(), WaitSignal("close", timeout=20),
                Close(1011, "internal error")], reply=()),
        Script([ToolCall(Call("c1", ORDER, {"id": 1})), WaitToolResponse("c1", timeout=20),
                Audio(chunks=2), TurnComplete()], reply=()),
    ]
    marks: dict[str, float] = {}

    async def drive(ctl: Ctl) -> None:
        assert await ctl.wait(lambda: bool(ctl.tap.speech) and not ctl.tap.speaking
                              and len(ctl.server.handles) > 0, timeout=10)
        with Unwritable(db):
            ctl.server.signal("close")
            await asyncio.sleep(DOWN_S)
            assert len(ctl.server.connections) == 1, "reconnected before the log took it"
            marks["up"] = time.time()
        assert await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking,
                              timeout=15), "no new session once the log was back"
        await ctl.settle()

    with error_log() as errors:
        run = await run_call(Flavour("sqlite", store), scripts, drive)

    assert any("StoreUnavailable" in e or "did not take" in e for e in errors), (
        "the log never refused the disconnect")
    assert len(run.connections) == 2
    assert run.connections[1].resumption_handle is not None, "resumed from no handle"
    assert run.connections[1].opened_at >= marks["up"]
    assert_server_clean(run)
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=1)
    assert_ran_once(run, "c1")
    assert run.at("connection.disconnected", generation=1) < run.at("connection.connected",
                                                                     generation=2)
    assert_log_settled(run)
    await assert_chain_ok(run)
