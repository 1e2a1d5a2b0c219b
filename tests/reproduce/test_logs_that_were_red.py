"""Real crash-harness logs that once re-ran red, checked in, re-run against today's service
(a second or two each). Each one was red for a mis-reproduction, not a service defect:

- go_away: the model's next turn came right behind the goAway, on the socket before the
  goAway was committed, so the reconnect (decided after that commit) found the bot
  speaking again and waited; sent only after the commit, it let the re-run reconnect at
  once. (Its logged observation also carries the time it was read: not compared.)
- prompt_change_turn_while_speaking: a second model turn whose audio came while the bot
  still spoke logged no start of its own; re-run without audio, the service counted one
  turn more than the transport played, and the bot's speech ended on the silence
  timeout (`timeout`) where the log has the transport's stop.
- prompt_change_result_during_connect: a tool's result logged between a new session's
  start and its seed arrived while that start was being committed; released after the
  commit, the seed (decided right after it, in the same task) always went first.
- phone_bot_moved_call (examples/phone_bot/fleet.py, its worker SIGKILLed mid-call; since
  184d475 today's service decides it otherwise, see the test of that below): the
  new worker's first context reached it while its session's start was being committed,
  so its seed found no session and started the deferred call alone, the sends after the
  seed. Sent when the re-run's worker started, the context started the call before the
  session; sent after the session's start, the call went out with the sends.
- phone_bot_refund_checked / phone_bot_refund_rerun: the killed worker died inside
  refund_order; the new worker's outcome check (run when it attaches, before any context)
  said done / not done. The rule above must not count what a worker settles on attaching
  as acting: the first red fleet run was a not-done refund re-run before the session where
  the log has it after. (In the checked-in rerun log the race went the other way: re-run
  before the session, context at once.)
- progress_call_tool_call_noted (PostgreSQL, no kill; 3 of 20 such logs have its shape): the
  toolCall came in while the bot's speech start was being committed, so it was noted, and
  the commit that took it also took the resumption handle right behind it, before the
  call's start. Sent after that commit, it was committed at once with its start, the
  handle after it.
- progress_call_tool_call_noted_after_seed (PostgreSQL, no kill; 1 of 80 runs after the fix
  above): the same, noted while the seed's confirmation was committed (the speech start
  in the toolCall's commit). The seed had run on the app's first context, which came after
  the session's start: sent before, the context had the seed run in the session's start,
  which holds the receive loop, and the toolCall was read only after the commit.
- progress_call_stop_during_send (PostgreSQL, no kill, load 4-6; 3 of 80 runs): the bot's
  speech stopped while the second intermediate result was being sent, between its intent's
  commit and its confirmation's, which logged the stop first. Played from the intent's
  commit, the audio (40 ms) outlasted the re-run's send: confirmed first, the stop after.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.reproduction import run_reproduction
from session_store.audit.reproduce import build, write
from tests.conftest import empty_database

pytestmark = pytest.mark.timeout(120)
LOGS = Path(__file__).parent / "logs"


def _lines(name: str) -> list[dict]:
    with open(LOGS / f"{name}.jsonl", encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


@pytest.mark.parametrize("name", ["go_away", "prompt_change_turn_while_speaking",
                                  "prompt_change_result_during_connect",
                                  "phone_bot_refund_checked",
                                  "phone_bot_refund_rerun",
                                  "progress_call_tool_call_noted",
                                  "progress_call_tool_call_noted_after_seed",
                                  "progress_call_stop_during_send"])
@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_log_that_was_red_reproduces_green(tmp_path, name, db):
    write(tmp_path / "repro", _lines(name))
    async with empty_database(db, tmp_path) as rerun:
        result = await run_reproduction(tmp_path / "repro", rerun.url,
                                        schema=rerun.options.get("schema"))
    assert result.divergence is None, result.divergence.message()
    assert not result.violations


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_log_from_before_a_change_diverges_where_the_change_decides(tmp_path, db):
    """Since 184d475 a takeover starts a call the dead worker left deferred as its pipeline
    starts, not after the new Gemini session's start (the model waits for it less). The
    moved call logged before that re-runs red at exactly that decision: what `reproduce`
    is for, a behaviour change shown where it acts."""
    lines = _lines("phone_bot_moved_call")
    write(tmp_path / "repro", lines)
    async with empty_database(db, tmp_path) as rerun:
        result = await run_reproduction(tmp_path / "repro", rerun.url,
                                        schema=rerun.options.get("schema"))
    d = result.divergence
    assert d is not None
    ready = next(x["version"] for x in lines if x["type"] == "decision.observed"
                 and x["data"]["kind"] == "SessionReady" and x["version"] > next(
                     y["version"] for y in lines if y["type"] == "session.worker_attached"))
    assert d.decision.first == ready, d.message()
    assert [x["type"] for x in d.actual][:1] == ["tool.call_started"], d.message()


def test_the_cause_of_each_red_is_in_the_reproduction():
    go_away = build(_lines("go_away"))["connections"][0]["steps"]
    at = next(i for i, s in enumerate(go_away) if s["step"] == "GoAway")
    assert go_away[at + 1]["step"] == "Audio" and go_away[at + 1]["at"] == go_away[at]["at"]

    turns = build(_lines("prompt_change_turn_while_speaking"))["connections"][1]["steps"]
    names = [s["step"] for s in turns]
    # both turns of the second session have audio (only the first logged a start)
    assert names.count("Audio") == names.count("OutputTranscript") == 3, names

    runs = build(_lines("prompt_change_result_during_connect"))["tool_runs"]
    (outcome,) = runs["lookup_order-1"][0]["outcomes"]
    assert outcome["during_commit"] is True and outcome["at"] == 20  # the start's commit

    noted = build(_lines("progress_call_tool_call_noted"))["connections"][0]["steps"]
    # the toolCall, the words before it and the handle behind it go out while the speech's
    # start (v8-10, from v7) commits; the second toolCall, committed on arrival, after v33
    assert [(s["step"], s["at"], s.get("during_commit", False)) for s in noted[:6]] == [
        ("Audio", 7, False), ("OutputTranscript", 7, True), ("TurnComplete", 7, True),
        ("ToolCall", 7, True), ("ResumptionUpdate", 7, True), ("Audio", 33, False)]
    assert [s["at"] for s in noted if s["step"] == "ToolCall"] == [7, 33]
    assert "context_after" not in build(_lines("progress_call_tool_call_noted"))["workers"][0]

    seeded = build(_lines("progress_call_tool_call_noted_after_seed"))
    # noted during the seed's confirmation (v6-7, from v5), the speech's audio with it; the
    # app's context goes in once the session's start (v3) is logged
    assert [(s["step"], s["at"], s.get("during_commit", False))
            for s in seeded["connections"][0]["steps"][:5]] == [
        ("Audio", 5, True), ("OutputTranscript", 5, True), ("TurnComplete", 5, True),
        ("ToolCall", 5, True), ("ResumptionUpdate", 5, True)]
    assert seeded["workers"][0]["context_after"] == 3

    # the stop (v26) came during the send of v24's intent, confirmed behind it (v27-28)
    stop = build(_lines("progress_call_stop_during_send"))["playback"]
    assert stop[0] == {"from": 24, "until": 26, "during_send": True}
    assert not any(w.get("during_send") for w in stop[1:] + build(_lines("go_away"))["playback"])

    workers = build(_lines("phone_bot_moved_call"))["workers"]
    attached = next(x["version"] for x in _lines("phone_bot_moved_call")
                    if x["type"] == "session.worker_attached")
    # the new worker's context goes in while its session's start (right after) commits
    assert [w["start_at"] for w in workers] == [None, attached]


@pytest.mark.parametrize("name", ["go_away", "phone_bot_moved_call"])
async def test_a_mutant_diverges_at_the_first_deferral_of_the_log(tmp_path, monkeypatch, name):
    """Tools no longer deferred while the bot speaks: the re-run of a log that is green on
    today's code names the log's first deferral, and nothing before it."""
    from session_store.policy import Policy

    lines = _lines(name)
    deferred = next(x["version"] for x in lines if x["type"] == "tool.call_deferred")
    write(tmp_path / "repro", lines)
    monkeypatch.setattr(Policy, "defers", lambda self, name, mode="blocking": False)
    result = await run_reproduction(tmp_path / "repro",
                                    f"sqlite+aiosqlite:///{tmp_path / 'mutant.db'}")
    assert result.divergence is not None
    assert result.divergence.version == deferred, result.divergence.message()
    assert (f"at v{deferred} the log has tool.call_deferred, today's service "
            f"tool.call_started") in result.divergence.message()

    checked = _lines("phone_bot_refund_checked")
    attached = next(x["version"] for x in checked if x["type"] == "session.worker_attached")
    assert any(x["type"] == "tool.outcome_checked" and x["version"] > attached for x in checked)
    # the outcome check settled on attaching does not count: the context waits for the session
    assert [w["start_at"] for w in build(checked)["workers"]] == [None, attached + 3]
