"""Settings changes (LLMUpdateSettingsFrame) that need no new session."""

from __future__ import annotations

import pytest
from pipecat.frames.frames import LLMUpdateSettingsFrame
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.local_live import Audio, Script, TurnComplete

from .helpers import (PROMPT_RECONNECTS, Ctl, assert_log_settled, assert_server_clean, run_call)

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)]


@PROMPT_RECONNECTS
async def test_a_settings_frame_that_changes_nothing_is_no_reconnect(flavour):
    """The app sends the prompt the session already has (a UI that re-applies its settings):
    nothing changed, so nothing is logged and no session is replaced. The real change the
    test sends right after it is handled in order (one settings.changed, one new session),
    so waiting for its session is waiting for the first frame too."""
    scripts = [Script([Audio(chunks=2), TurnComplete()], reply=()),
               Script([Audio(chunks=2), TurnComplete()], reply=()),
               Script([Audio(chunks=2), TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking)
        for prompt in ("Be brief.", "NEW"):
            await ctl.task.queue_frame(LLMUpdateSettingsFrame(
                delta=GeminiLiveLLMService.Settings(system_instruction=prompt)))
        assert await ctl.wait(lambda: any(c.system_instruction == "NEW"
                                          for c in ctl.server.connections))
        assert await ctl.wait(lambda: ctl.script_done(len(ctl.server.connections) - 1)
                              and not ctl.tap.speaking)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive)

    assert [c.system_instruction for c in run.connections] == ["Be brief.", "NEW"]
    assert [e.data["keys"] for e in run.find("settings.changed")] == [["system_instruction"]], (
        run.timeline())
    assert len(run.find("connection.reconnect_requested")) == 1, run.timeline()
    assert_server_clean(run)
    assert_log_settled(run)
