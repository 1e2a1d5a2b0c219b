"""What a fresh session's seed says: the conversation as the log holds it, speaker by speaker.

The pipeline context's opening messages are logged once (`_log_initial_context`) and every
fresh session is seeded from the log, the call's first one included. Gemini 2.5 takes a seed
only if its last turn is the user's: one ending with the bot's words gets a blank user turn.
"""

from __future__ import annotations

import pytest

from service.local_live import Audio, Close, Script, Sleep, TurnComplete
from session_store.audit.replay import logged_decisions, replay

from .helpers import (Ctl, assert_log_settled, assert_server_clean, generation_of, run_call)

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)]

OPENING = [{"role": "user", "content": "Hello"},
           {"role": "assistant", "content": "Hi, how can I help?"}]


def seeds(connection) -> list[list[tuple[str, str]]]:
    """The (role, text) turns of each clientContent a connection received."""
    return [[(turn.get("role"), "".join(part.get("text", "") for part in turn.get("parts") or []))
             for turn in message.body.get("turns") or []]
            for message in connection.received if message.kind == "client_content"]


async def _first_session_dies_before_any_handle(flavour):
    """A call whose first session dies before Gemini issued a handle: the second starts
    fresh and is seeded from the log."""
    scripts = [Script([Sleep(0.3), Close(1011, "internal error")], reply=(),
                      resumption_after_turn=False),
               Script([Audio(chunks=2), TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    return await run_call(flavour, scripts, drive, messages=OPENING)


async def test_fresh_sessions_are_seeded_with_each_speaker_in_its_role(flavour):
    """The first session dies before Gemini issued any handle: the second starts fresh and
    is seeded from the log. Both seeds give the bot's opening line to the model, and on 2.5
    end with a (blank) user turn (pipecat: 2.5 wants a seed to end with one; 3.x does not)."""
    run = await _first_session_dies_before_any_handle(flavour)

    assert len(run.connections) == 2
    assert run.connections[1].resumption_handle is None
    expected = [("user", "Hello"), ("model", "Hi, how can I help?")] + (
        [("user", " ")] if generation_of(run) == "2.5" else [])
    for connection in run.connections:
        assert seeds(connection) == [expected], (
            f"connection {connection.index} was seeded with {seeds(connection)}")
    assert [(e.data["role"], e.data["text"]) for e in run.find("conversation.message")][:2] == [
        ("user", "Hello"), ("assistant", "Hi, how can I help?")], run.timeline()
    assert_server_clean(run)
    assert_log_settled(run)


async def test_whether_the_model_answers_a_seed_is_decided_on_the_log_per_generation(flavour):
    """The first seed is answered as the app asks (pipecat's default: it is); after the
    reconnect only 2.5 is asked to recap. What each session got (turnComplete, and on 3.x
    the realtime text nudge) is what the log's seed intent says, and replay decides it
    again from the logged `SeedAsked`."""
    run = await _first_session_dies_before_any_handle(flavour)

    assert len(run.connections) == 2
    family = generation_of(run)
    intents = run.find("conversation.sending", via="seed")
    assert [e.data.get("answer", False) for e in intents] == [True, family == "2.5"], intents
    for connection, intent in zip(run.connections, intents):
        answer = intent.data.get("answer", False)
        [seed] = [m.body for m in connection.received if m.kind == "client_content"]
        assert bool(seed.get("turn_complete")) == answer, (connection.index, seed)
        nudges = [m.body for m in connection.received
                  if m.kind == "realtime_input" and isinstance(m.body.get("text"), str)]
        assert nudges == ([{"text": " "}] if answer and family != "2.5" else []), nudges
    kinds = [type(d.observation).__name__ for d in logged_decisions(run.events)]
    assert kinds.count("SeedAsked") == 2, kinds
    report = replay(run.events)
    assert not [d for d in report.divergences
                if (d.observation or {}).get("observation") == "SeedAsked"], report.divergences
    assert not report.not_replayed, report.coverage
    assert_server_clean(run)
    assert_log_settled(run)
