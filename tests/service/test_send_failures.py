"""A send that fails on a live socket, through the real pipeline and the local server: the
failure is observed (decide.SendFailed), the session is replaced because the log says so
(the reconnect it asked for is due at once), and the result that did not go out reaches the
next session once. Replay decides the failure again."""

from __future__ import annotations

import pytest

from service.local_live import Audio, Call, Script, Sleep, ToolCall, TurnComplete
from session_store.audit import replay
from session_store.audit.replay import logged_decisions

from .helpers import (BLOCKING_CALLS, Ctl, assert_ran_once, assert_server_clean, run_call)

pytestmark = pytest.mark.timeout(90)


@BLOCKING_CALLS
@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_result_whose_send_fails_replaces_the_session_and_reaches_the_next(flavour):
    scripts = [Script([Sleep(0.5), ToolCall(Call("c1", "lookup_order", {"id": 1})),
                       Sleep(6.0)], reply=()),
               Script([Audio(chunks=2), TurnComplete()], reply=())]
    failed: list[str] = []

    async def drive(ctl: Ctl):
        llm = ctl.llm
        assert await ctl.wait(lambda: llm._session is not None, timeout=10)
        session = llm._session

        async def wedged(**_kw):
            failed.append("c1")
            raise RuntimeError("the socket is wedged")

        # (an instance attribute: only this session's sends fail)
        session.send_tool_response = wedged
        assert await ctl.wait(lambda: ctl.results("c1") and len(ctl.server.connections) == 2
                              and ctl.script_done(1) and not ctl.tap.speaking, timeout=15)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, timeout=30)

    assert failed == ["c1"], failed
    assert_ran_once(run, "c1")
    assert [r.connection for r in run.results("c1")] == [1], run.timeline()
    anomaly, = run.find("anomaly.recorded", kind="send_failed")
    assert anomaly.data["detail"]["what"] == "result"
    assert anomaly.data["detail"]["error"] == "RuntimeError: the socket is wedged"
    asked = run.at("connection.reconnect_requested", reason="send_failed")
    left = run.at("connection.disconnected", generation=1, reason="send_failed")
    assert anomaly.version < asked < left, run.timeline()
    assert_server_clean(run)
    report = replay(run.events)
    n = len(list(logged_decisions(run.events)))
    assert report.ok, [d.message for d in report.divergences]
    assert report.coverage == f"{n} of {n} decisions replayed", report.coverage
