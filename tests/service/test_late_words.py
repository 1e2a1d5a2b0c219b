"""Late input transcription on 3.x (issue #34 item 9), on the wire: the user's last words
transcribed after the model's answer belong with the turn they were said in, in the log and
in every seed, not as a new user turn dangling after the answer (which a model may answer
again). Real service, real google-genai client, local Gemini Live server, both databases."""

from __future__ import annotations

import pytest

from service.local_live import (Audio, Call, Close, InputTranscript, OutputTranscript,
                                ResumptionUpdate, Script, Sleep, ToolCall, TurnComplete,
                                WaitFor, WaitToolResponse)
from session_store import events as ev
from session_store.delivery import seed_plan

from .helpers import Ctl, assert_log_settled, assert_server_clean, handles_of, run_call

G25 = "models/gemini-2.5-flash-native-audio-preview"
G31 = "models/gemini-3.1-flash-live-preview"
G38 = "models/gemini-3.8-live"
ANSWER = "The code word is swordfish."

pytestmark = [pytest.mark.timeout(120), pytest.mark.own_model]


def first_session(*, handle_after_answer: bool) -> Script:
    """"Tell me" heard, the answer, then the rest of the question transcribed late."""
    return Script([WaitFor("client_content"), InputTranscript("Tell me"),
                   OutputTranscript(ANSWER), Audio(chunks=2), TurnComplete(),
                   *([ResumptionUpdate()] if handle_after_answer else []),
                   Sleep(0.2), InputTranscript(" the code word?"), Sleep(0.5),
                   Close(1011, "internal error")], reply=(), resumption_after_turn=False)


def second_session() -> Script:
    return Script([WaitFor("client_content", timeout=2, required=False), Audio(chunks=2),
                   TurnComplete()],
                  reply=())


async def drive(ctl: Ctl):
    await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
    await ctl.settle()


def logged_turns(run) -> list[tuple[str, str, bool]]:
    return [(r.data["role"], r.data["text"], r.data["late"])
            for r in run.events if r.type == "conversation.message"]


@pytest.mark.parametrize("model", [G31, G38])
async def test_late_words_are_seeded_before_the_answer(flavour, model):
    if not flavour.durable:
        pytest.skip("the stock service keeps no conversation of its own")
    run = await run_call(flavour, [first_session(handle_after_answer=False), second_session()],
                         drive, model=model)

    assert_server_clean(run)
    turns = logged_turns(run)
    assert ("user", "the code word?", True) in turns, turns
    assert run.connections[1].resumption_handle is None
    seeded = [(e.role, e.text) for e in run.connections[1].state.conversation
              if e.how == "content"]
    words, answer = seeded.index(("user", "the code word?")), seeded.index(("model", ANSWER))
    assert seeded[words - 1:answer + 1] == [("user", "Tell me"), ("user", "the code word?"),
                                            ("model", ANSWER)], seeded
    # The fold places them the same way for any later seed.
    conversation = run.state.conversation
    assert conversation.index(("user", "the code word?")) < conversation.index(
        ("assistant", ANSWER))
    assert_log_settled(run)


async def test_a_handle_issued_after_the_answer_holds_the_late_words(flavour):
    """The model heard the question before answering it: a 3.x handle issued after the
    answer is resumed from, not passed over for lacking the late transcription."""
    if not flavour.durable:
        pytest.skip("the stock service keeps no conversation of its own")
    run = await run_call(flavour, [first_session(handle_after_answer=True), second_session()],
                         drive, model=G38)

    assert_server_clean(run)
    assert ("user", "the code word?", True) in logged_turns(run)
    assert run.connections[1].resumption_handle == handles_of(run.server, 0)[-1]
    assert_log_settled(run)


async def test_on_2_5_words_after_the_answer_are_a_turn_of_their_own(flavour):
    """2.5 transcribes the user as they speak: words after the answer are a new turn."""
    if not flavour.durable:
        pytest.skip("the stock service keeps no conversation of its own")
    run = await run_call(flavour, [first_session(handle_after_answer=False), second_session()],
                         drive, model=G25)

    assert ("user", "the code word?", False) in logged_turns(run)
    conversation = run.state.conversation
    assert conversation.index(("user", "the code word?")) > conversation.index(
        ("assistant", ANSWER))


def test_the_fold_places_late_words_with_their_turn_in_every_seed():
    """Pure: the event's `late` flag, folded (here without the wire)."""
    from tests.core.helpers import Log  # noqa: PLC0415 - the core's hand-built streams
    log = Log()
    log.add(ev.SessionOpened(model=G38, tools=[], worker="w", epoch=1), ev.Connected(1),
            ev.ConversationMessage("user", "Tell me", 1),
            ev.ConversationMessage("assistant", ANSWER, 1),
            ev.ConversationMessage("user", "the code word?", 1, late=True),
            ev.ConversationMessage("user", "Thanks!", 1))
    state = log.state()
    assert seed_plan(state).turns == [("user", "Tell me"), ("user", "the code word?"),
                                      ("assistant", ANSWER), ("user", "Thanks!")]
    # Heard when the answer was: a handle after the answer holds them.
    assert [v for v, _g in state.message_marks] == [3, 4, 4, 6]


async def test_what_the_bot_said_before_a_call_is_logged_before_the_call(flavour):
    """The transcription of "let me look" is logged at the toolCall, ahead of it: a seed or
    catch-up then holds what the caller heard, in the order they heard it."""
    if not flavour.durable:
        pytest.skip("the stock service keeps no conversation of its own")
    script = Script([WaitFor("client_content"), InputTranscript("Where is order 1?"),
                     Audio(chunks=2), OutputTranscript("Let me look."),
                     ToolCall(Call("c1", "lookup_order", {"id": 1})),
                     WaitToolResponse("c1", timeout=5), Audio(chunks=2), TurnComplete()],
                    reply=())

    async def until_done(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, [script], until_done, model=G25)

    said = run.find("conversation.message", role="assistant")
    assert [e.data["text"] for e in said] == ["Let me look."]
    assert said[0].version < run.find("tool.call_requested", call_id="c1")[0].version
    turns = seed_plan(run.state).turns
    called = ("assistant", '[Called function lookup_order with args {"id": 1}]')
    assert turns.index(("assistant", "Let me look.")) + 1 == turns.index(called), turns
