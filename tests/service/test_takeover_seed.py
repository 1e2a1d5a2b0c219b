"""A takeover's fresh session: the results the dead worker left undelivered go in its seed.

A worker that takes a call over (a new process on the same log) opens a fresh session: the
old one's handle may be gone, and here it never had one. Its first session can be ready
before the pipeline's first context, and pipecat seeds a fresh session only with that
context. A result the log says is due must wait for the seed: the seed carries every result
the model has not got, so one sent on its own just before reaches the model twice
(`Seeder.awaiting_seed`). Until this test, only one timing-dependent crash case
caught a service that sent it early; here the order is forced: the context is held back
until the session is ready and has had time to send.
"""

from __future__ import annotations

import json
import uuid

import pytest

from service.driver import CallDriver
from service.local_live import (Audio, Call, Close, HandleRecord, ModelState, Script, ToolCall,
                                ToolResult, TurnComplete)
from rig.testing.pipeline import MODEL
from session_store import Policy
from session_store import events as ev
from session_store.decide import FunctionCall, ToolCallsArrived
from session_store.delivery import StartCall
from session_store.errors import CallClosed
from session_store.models import rules_for

from .helpers import (TOOLS, Ctl, assert_answered_once, assert_log_settled, assert_server_clean,
                      run_call)

pytestmark = pytest.mark.timeout(60)

ORDER = "lookup_order"
RESULT = {"ok": True, "status": "shipped"}


async def dead_workers_log(store, call_id: str, *, completed: bool = True,
                           model: str = MODEL) -> None:
    """What a worker killed after c1's tool returned left in the log: the call connected (no
    handle yet), the user spoke, c1 ran and completed; its result was never sent.
    `completed=False`: killed while c1 ran (the call is in doubt)."""
    driver = CallDriver(store, call_id, Policy(defer="none"), worker_id="dead-worker")
    await driver.attach(model=model, tools=[ORDER], settings={"model": model})
    await driver.record(ev.Connected(1, None, "x"),
                        ev.ConversationMessage("user", "Where is order 48213?", 1))
    await driver.observe(ToolCallsArrived((FunctionCall("c1", ORDER, {"id": 48213}),), 1),
                         intend=frozenset({StartCall}))
    if completed:
        await driver.record(ev.ToolCallCompleted("c1", RESULT))


async def test_a_takeover_sends_an_undelivered_result_once_in_its_seed(flavour):
    if not flavour.durable:
        pytest.skip("a takeover needs the log")
    call_id = f"call-{uuid.uuid4().hex[:10]}"
    await dead_workers_log(flavour.store, call_id, model=flavour.model)

    async def drive(ctl: Ctl):
        # The fresh session is ready before the first context: nothing may go out before it.
        assert await ctl.wait(lambda: len(ctl.server.connections) == 1
                              and ctl.llm._session is not None, timeout=10)
        await ctl.settle(0.5)
        before_seed = [m.kind for m in ctl.server.connections[0].received]
        assert "client_content" not in before_seed and "tool_response" not in before_seed, (
            f"sent before the session was seeded: {before_seed}")
        await ctl.run_llm()
        assert await ctl.wait(lambda: ctl.results("c1") and not ctl.tap.speaking
                              and ctl.script_done(0), timeout=10)
        await ctl.settle()

    run = await run_call(flavour, Script([], reply=(Audio(chunks=2), TurnComplete())), drive,
                         call_id=call_id, run_first=False)

    assert len(run.connections) == 1
    result = assert_answered_once(run, "c1", ORDER, via="content", connection=0)
    assert result.response == RESULT
    assert run.runs() == [], "the tool ran again: the log says it completed"
    assert_server_clean(run)
    assert [e.data["via"] for e in run.find("tool.result_sent", call_id="c1")] == ["seed"]
    assert_log_settled(run)


async def test_a_worker_given_an_ended_call_opens_no_session_and_says_so(flavour):
    """A worker started for a call whose log says it ended (its worker died after
    `session.closed`, and the app started another) attached, appended after the end, and
    opened a Gemini session for a call nobody was on, whose end it then never logged. It
    now refuses at setup, before writing anything: CallClosed, which pipecat reports as the
    service's setup error (the service can no longer do its job), and no connection."""
    if not flavour.durable:
        pytest.skip("an ended call is the log's")
    call_id = f"call-{uuid.uuid4().hex[:10]}"
    await dead_workers_log(flavour.store, call_id, model=flavour.model)
    ended = CallDriver(flavour.store, call_id, Policy(), worker_id="ending-worker")
    await ended.attach(model="m", tools=[ORDER], settings={})
    await ended.record(ev.SessionClosed("ended"))
    before = await flavour.store.read(call_id)

    async def drive(ctl: Ctl):
        await ctl.settle(1.0)

    run = await run_call(flavour, Script([]), drive, call_id=call_id, run_first=False)
    assert run.events == before, (
        f"a worker wrote after the end: {[e.type for e in run.events[len(before):]]}")
    assert len(run.connections) == 0, "a Gemini session was opened for an ended call"
    with pytest.raises(CallClosed, match=f"call '{call_id}' ended"):
        await CallDriver(flavour.store, call_id, Policy(), worker_id="w3").attach(
            model="m", tools=[ORDER], settings={})


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_takeover_opens_its_session_with_the_prompt_the_log_holds(flavour):
    """The app changed the prompt (and the voice) before its worker died (the change and its reconnect are
    in the log). A new worker is constructed with the app's original settings, as a
    restarted process would be: its first session must carry the prompt as the log says it
    is now, not the one it was constructed with; and so must every later session."""
    call_id = f"call-{uuid.uuid4().hex[:10]}"
    driver = CallDriver(flavour.store, call_id, Policy(), worker_id="dead-worker")
    await driver.attach(model="m", tools=[ORDER], settings={"system_instruction": "Be brief."})
    await driver.record(ev.Connected(1, None, "x"),
                        ev.ConversationMessage("user", "Hello", 1),
                        ev.SettingsChanged(["system_instruction", "voice"],
                                           {"system_instruction": "Speak French.",
                                            "voice": "Kore"}, True),
                        ev.ReconnectRequested("settings", ["system_instruction", "voice"]),
                        ev.Disconnected(1, "settings"),
                        ev.Connected(2, None, "y"))

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    # The first session dies after a turn: the one that replaces it keeps the prompt too.
    scripts = [Script([Audio(chunks=2), TurnComplete(), Close(1011, "internal error")],
                      reply=()),
               Script([Audio(chunks=2), TurnComplete()], reply=())]
    run = await run_call(flavour, scripts, drive, call_id=call_id)

    assert [c.system_instruction for c in run.connections] == ["Speak French."] * 2, (
        f"prompts the takeover's sessions carried: "
        f"{[c.system_instruction for c in run.connections]}")
    voices = [json.dumps(c.setup).count('"Kore"') for c in run.connections]
    assert voices == [1, 1], f"the log's voice in each session's setup: {voices}"
    assert_server_clean(run)
    assert run.find("session.worker_attached"), run.timeline()
    assert_log_settled(run)


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_seed_carrying_a_new_result_asks_the_model_to_act_on_it(flavour):
    """An app that does not want a first response to its opening context
    (`inference_on_context_initialization=False`): its seed normally leaves the turn open.
    A takeover's seed that carries a result the model never got must close the turn
    anyway: Gemini acts on content only with turnComplete, and the model is waiting for
    that answer (left open, the bot stays silent)."""
    call_id = f"call-{uuid.uuid4().hex[:10]}"
    await dead_workers_log(flavour.store, call_id, model=flavour.model)

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.server.connections
                       and ctl.server.connections[0].state.acted_on("c1"), timeout=8)
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=5)
        await ctl.settle()

    run = await run_call(flavour, Script([], reply=(Audio(chunks=2), TurnComplete())), drive,
                         call_id=call_id, inference_on_context_initialization=False)

    (seed,) = run.connections[0].messages("client_content")
    assert seed.body.get("turn_complete") is True, seed.body
    assert run.connections[0].state.acted_on("c1"), run.connections[0].state.to_json()
    assert_answered_once(run, "c1", ORDER, via="content", connection=0)
    assert_server_clean(run)
    assert_log_settled(run)


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_call_left_in_doubt_is_settled_in_the_takeovers_seed(flavour):
    """The dead worker had started c1 (not idempotent) and died before it returned: the call
    is in doubt. The takeover settles it ("outcome unknown") before its first session is
    seeded, so the model learns it with its history, in the seed, not as a separate
    message after it (nor by the tool running again)."""
    call_id = f"call-{uuid.uuid4().hex[:10]}"
    await dead_workers_log(flavour.store, call_id, completed=False, model=flavour.model)

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: ctl.results("c1") and not ctl.tap.speaking
                              and ctl.script_done(0), timeout=10)
        await ctl.settle()

    # A slow handshake: the pipeline's first context is there before the session is ready,
    # so pipecat seeds it first thing when it is (before anything else is performed).
    run = await run_call(flavour, Script([], reply=(Audio(chunks=2), TurnComplete()),
                                         setup_delay=1.0), drive, call_id=call_id)

    assert run.runs() == [], "a non-idempotent call in doubt ran again"
    result = assert_answered_once(run, "c1", ORDER, via="content", connection=0)
    assert result.response.get("outcome_unknown") is True, result.response
    assert [e.data["via"] for e in run.find("tool.result_sent", call_id="c1")] == ["seed"], (
        run.timeline())
    assert run.at("tool.call_failed", call_id="c1") < run.at("connection.connected",
                                                              generation=2)
    assert_server_clean(run)
    assert_log_settled(run)


def handle_issued_after_the_answer(call_id: str, model: str) -> dict[str, HandleRecord]:
    """The server's side of a dead worker's session: it issued `h-dead` once it held c1's
    answer (sent by toolResponse), so a session resumed from it knows the whole call, and
    the tools as the dead worker's setup declared them (a resumed session keeps its
    handle's: a sync tool is BLOCKING where calls default to NON_BLOCKING, as pipecat
    declares it)."""
    answer = ToolResult(connection=0, id="c1", name=ORDER, response=RESULT,
                        via="tool_response", accepted=True, client_message_index=3, at=0.0)
    rules = rules_for(model)
    declared = "BLOCKING" if rules.calls_default_non_blocking and rules.blocking_declarations \
        else None
    state = ModelState(issued={"c1": ORDER}, results={"c1": answer},
                       tools={name: declared for name in TOOLS})
    return {"h-dead": HandleRecord("h-dead", connection=0, state=state, last_consumed=3, at=0.0)}


@pytest.mark.parametrize("context_first", [True, False], ids=["context-first", "session-first"])
async def test_a_takeover_resumed_from_a_handle_is_not_seeded_again(flavour, context_first):
    """The dead worker's session issued a handle after c1 was answered: the takeover resumes
    from it, and a resumed session already holds the conversation and c1's answer. Seeding
    it as a fresh one put the history into the model a second time (upstream does, on its
    first context). Both orders: the pipeline's first context before the session is ready
    (pipecat seeds when it is) and after (pipecat seeds on the context). The resumed session
    then goes on: the next call is answered by toolResponse."""
    if not flavour.durable:
        pytest.skip("a takeover needs the log")
    call_id = f"call-{uuid.uuid4().hex[:10]}"
    await dead_workers_log(flavour.store, call_id, model=flavour.model)
    driver = CallDriver(flavour.store, call_id, Policy(defer="none"), worker_id="dead-worker-2")
    await driver.attach(model=flavour.model, tools=[ORDER], settings={})
    await driver.record(ev.ToolResultSending("c1", 1, "tool_response"),
                        ev.ToolResultSent("c1", 1, "tool_response"),
                        ev.HandleIssued(1, "h-dead", 3))

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: ctl.llm._session is not None, timeout=10)
        if not context_first:
            await ctl.settle(0.3)
            await ctl.run_llm()
        # Not asserted here: the checks below say what went wrong if c2 is never answered.
        await ctl.wait(lambda: ctl.results("c2") and ctl.script_done(0)
                       and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    script = Script([Audio(chunks=2), ToolCall(Call("c2", ORDER, {"id": 7})), Audio(chunks=2),
                     TurnComplete()], setup_delay=0.3 if context_first else 0.0)
    run = await run_call(flavour, script, drive, call_id=call_id, run_first=context_first,
                         server_handles=handle_issued_after_the_answer(call_id, flavour.model))

    assert [c.resumed_from for c in run.connections] == ["h-dead"], (
        "the takeover did not resume from the dead worker's handle")
    sent = [m.kind for m in run.connections[0].received]
    assert "client_content" not in sent, f"a resumed session was seeded again: {sent}"
    assert_answered_once(run, "c2", ORDER, via="tool_response", connection=0)
    assert run.results("c1") == [], "c1's answer, already in the model, went out again"
    assert [r["call_id"] for r in run.runs()] == ["c2"], "c1 ran again: the log says it completed"
    assert_server_clean(run)
    assert_log_settled(run)
