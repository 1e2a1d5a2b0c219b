"""Handles issued before the server has read what was just sent as content.

A fresh session is seeded (the conversation so far, and every result the model has not
got) once it is ready; a resumed one gets a result its state never issued as content. The
server may issue a resumption handle before it has read that content (one sent right after
setupComplete crosses it on the wire): the handle's state lacks it, and a session resumed
from it lacks the conversation, or the result. The client reads such a handle only after it
sent the content, so the log's order alone ranks it after the send ("held"). Only a model
reaction read after the send shows the server has read it.
"""

from __future__ import annotations

import pytest

from service.local_live import (Audio, Call, Close, ResumptionUpdate, Script, Sleep, ToolCall,
                                TurnComplete, WaitFor, WaitToolResponse)
from service.local_live import LocalLiveServer

from .helpers import (Ctl, assert_log_settled, assert_ran_once, assert_server_clean,
                      content_via, resumes_past_a_call, run_call)

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"


def texts_in_model(server: LocalLiveServer, index: int, upto: int | None = None) -> list[str]:
    """The conversation text a connection's model state holds: what it received itself (up
    to message `upto`), after what the handle it resumed from had received by its issue."""
    connection = server.connections[index]
    texts: list[str] = []
    if connection.resumed_from is not None:
        handle = server.handles[connection.resumed_from]
        texts += texts_in_model(server, handle.connection, handle.last_consumed)
    for message in connection.received:
        if upto is not None and message.index > upto:
            break
        if message.kind == "client_content":
            texts += [part.get("text", "") for turn in message.body.get("turns") or []
                      for part in turn.get("parts") or []]
    return texts


@pytest.mark.stock_bug("resumes from the newest handle, issued before the seed reached the "
                       "server: the session lacks the conversation")
async def test_a_handle_issued_before_the_first_seed_is_not_resumed(flavour):
    """The call's first session: Gemini issues a handle at once, then the session dies before
    any other. Resuming from that handle would give a session that never heard the
    conversation's opening ("Hello"): the next session must be seeded afresh."""
    scripts = [
        Script([ResumptionUpdate(), Sleep(0.5), Close(1011, "internal error")], reply=(),
               resumption_after_turn=False),
        Script([Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive)

    assert len(run.connections) == 2
    assert run.server.handles, "the server issued no handle"
    assert "Hello" in texts_in_model(run.server, 1), (
        f"the second session lacks the conversation (resumed from "
        f"{run.connections[1].resumed_from}: {run.server.to_json()['handles']})")
    assert_server_clean(run)
    if flavour.durable:
        assert run.find("connection.connected", generation=2)[0].data["handle"] is None
        assert_log_settled(run)


@pytest.mark.stock_bug("resumes from a handle issued before the seed reached the server: the "
                       "seeded result is lost")
async def test_a_handle_issued_before_a_seed_with_a_result_is_not_resumed(flavour):
    """c1's result is produced while no session is open; the next session is fresh (no
    handle before), seeded with it. That session issues a handle at once and dies: resumed
    from it, the model would never get c1's result (the log counted it held: I1)."""
    scripts = [
        Script([ToolCall(Call("c1", ORDER, {"id": 1})), Close(1011, "internal error")],
               reply=(), resumption_after_turn=False),
        Script([ResumptionUpdate(), Sleep(0.6), Close(1011, "internal error")], reply=(),
               setup_delay=0.6, resumption_after_turn=False),
        Script([WaitToolResponse("c1", timeout=3), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(2) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, tool_delay=0.2)

    assert len(run.connections) == 3
    assert run.server.handles.get("handle-1-1") is not None, run.server.to_json()["handles"]
    assert_ran_once(run, "c1")
    assert_server_clean(run)
    # The session the call ends on holds c1's result (once: assert_server_clean).
    assert "c1" in run.connections[2].state.results
    if flavour.durable:
        assert run.find("tool.result_sent", call_id="c1")[0].data["via"] == "seed", run.timeline()
        assert run.find("connection.connected", generation=3)[0].data["handle"] is None
        assert_log_settled(run)


@pytest.mark.stock_bug("resumes from a handle issued before a result sent as content reached "
                       "the server: the result is lost")
async def test_a_handle_issued_before_a_result_sent_as_content_is_not_resumed(flavour):
    """The same crossing on a resumed session: c1's result goes in as content at once (the
    resumed state never issued c1), while Gemini's first message, a handle, is on its way.
    That handle lacks c1's result; resumed from it, the model would never get it."""
    scripts = [
        # (Speaking once it has the opening seed: this test is about the resumed session.)
        Script([WaitFor("client_content"), Audio(chunks=2), TurnComplete(),
                ToolCall(Call("c1", ORDER, {"id": 1})), Close(1011, "internal error")],
               reply=()),
        Script([ResumptionUpdate(), Sleep(0.6), Close(1011, "internal error")], reply=(),
               setup_delay=0.8, resumption_after_turn=False),
        Script([WaitToolResponse("c1", timeout=3), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(2) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, tool_delay=0.2)

    assert len(run.connections) == 3
    # (From 3.1 on, a handle older than c1 is not resumed from at all: the seeded session
    # is the test above's.)
    resumed = resumes_past_a_call(run)
    assert run.connections[1].resumed_from == ("handle-0-1" if resumed else None)
    assert "handle-1-2" in run.server.handles, run.server.to_json()["handles"]
    assert_ran_once(run, "c1")
    assert_server_clean(run)
    assert "c1" in run.connections[2].state.results
    if flavour.durable:
        assert [e.data["via"] for e in run.find("tool.result_sent", call_id="c1")][0] in (
            [content_via(run, logged=True)] if resumed else ["seed", "text"]), run.timeline()
        assert_log_settled(run)


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_handles_last_consumed_index_is_persisted_with_it(flavour):
    """Vertex sends `lastConsumedClientMessageIndex` with a handle: the delivery rules count
    a send as held by the handle's state when the index covers it, so the log must keep it
    exactly as the server sent it (and none where the server sent none)."""
    scripts = [Script([Audio(chunks=2), TurnComplete(), ResumptionUpdate(last_consumed=True)],
                      reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=8)
        await ctl.wait(lambda: len(ctl.server.handles) >= 2, timeout=8)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive)

    assert_server_clean(run)
    issued = sorted(run.server.handles.values(), key=lambda h: h.at)
    assert len(issued) == 2  # after the turn (Gemini's rule), then the one with an index
    logged = {e.data["handle"]: e.data["last_consumed_client_message_index"]
              for e in run.find("connection.handle_issued")}
    assert logged == {issued[0].handle: None, issued[1].handle: issued[1].last_consumed}, (
        run.timeline())
    assert issued[1].last_consumed is not None  # (0 here: a valid index, not "none")
    assert run.state.handles[issued[1].handle].last_consumed_client_message_index == \
        issued[1].last_consumed
    assert_log_settled(run)
