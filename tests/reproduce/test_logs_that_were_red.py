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
                                  "prompt_change_result_during_connect"])
@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_log_that_was_red_reproduces_green(tmp_path, name, db):
    write(tmp_path / "repro", _lines(name))
    async with empty_database(db, tmp_path) as rerun:
        result = await run_reproduction(tmp_path / "repro", rerun.url,
                                        schema=rerun.options.get("schema"))
    assert result.divergence is None, result.divergence.message()
    assert not result.violations


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
