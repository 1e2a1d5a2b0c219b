"""Lazy notes, on a SQLite store that commits urgent appends inline (`inline="urgent"`):
facts that decide nothing by themselves (speech started, a resumption handle, a send
confirmed, a stop nothing waits for) wait to share the next commit, so the log is free when a
toolCall comes; a fact something waits for is logged at once. On the default stores every
fact is committed at once.

Each test stretches the lazy wait to 30 s, so a lazy fact is logged only by riding along with
another append (or at the call's end): what is asserted cannot happen by the timer.
"""

from __future__ import annotations

import pytest

from service import log_writer
from service.local_live import Audio, Call, Script, Sleep, ToolCall, TurnComplete, WaitToolResponse
from session_store import Policy

from .helpers import (Ctl, Flavour, assert_answered_once, assert_chain_ok, assert_log_settled,
                      assert_ran_once, assert_server_clean, run_call, migrated_sqlite)

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"


@pytest.fixture
async def urgent(tmp_path):
    """Our service on a SQLite store that commits urgent appends inline (no budget guard:
    this machine's disk may be slow at any moment): where lazy notes apply."""
    async with migrated_sqlite(tmp_path / "urgent.db", inline="urgent", inline_budget=60.0) as store:
        yield Flavour("sqlite", store)


@pytest.fixture
async def default_sqlite(tmp_path):
    """The default SQLite store (every commit in its writer process): lazy notes apply too."""
    async with migrated_sqlite(tmp_path / "default.db") as store:
        yield Flavour("sqlite", store)


@pytest.fixture(params=["urgent", "default_sqlite"])
def sqlite_store(request):
    return request.getfixturevalue(request.param)


@pytest.fixture
def lazy_for_long(monkeypatch):
    monkeypatch.setattr(log_writer, "LAZY_NOTE_WAIT_S", 30.0)


def speech_then_call() -> list[Script]:
    return [Script([Audio(chunks=3), Sleep(0.3), ToolCall(Call("c1", ORDER, {"id": 1})),
                    WaitToolResponse("c1"), Audio(chunks=2), TurnComplete()], reply=())]


async def until_quiet(ctl: Ctl):
    await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking)
    await ctl.settle()


async def test_speech_started_rides_with_the_tool_call_commit(sqlite_store, lazy_for_long):
    run = await run_call(sqlite_store, speech_then_call(), until_quiet,
                         policy=Policy(defer="none"))

    assert_server_clean(run)
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    assert_ran_once(run, "c1")
    started = run.events[run.at("speech.bot_started") - 1]
    requested = run.events[run.at("tool.call_requested", call_id="c1") - 1]
    # Noted 0.3 s before the toolCall, logged in the toolCall's commit (one recorded time),
    # ahead of it: the call was decided on a state that knew the bot was speaking.
    assert started.version < requested.version
    assert started.recorded_at_us == requested.recorded_at_us, run.timeline()
    # The send's confirmation, lazy too, is not lost: logged by the call's end at the latest.
    assert run.find("tool.result_sent", call_id="c1"), run.timeline()
    assert_log_settled(run)
    await assert_chain_ok(run)


async def test_notes_are_not_lazy_on_postgres(flavour, lazy_for_long):
    """PostgreSQL: each fact is committed at once (lazy facts measured no gain there)."""
    if flavour.name != "postgres":
        pytest.skip("PostgreSQL's store")
    run = await run_call(flavour, speech_then_call(), until_quiet, policy=Policy(defer="none"))
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    started = run.events[run.at("speech.bot_started") - 1]
    requested = run.events[run.at("tool.call_requested", call_id="c1") - 1]
    assert started.recorded_at_us < requested.recorded_at_us, run.timeline()
    assert_log_settled(run)


async def test_a_stop_that_releases_a_deferred_call_is_logged_at_once(urgent, lazy_for_long):
    scripts = [Script([Audio(chunks=10), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=10),
                       TurnComplete(), WaitToolResponse("c1", timeout=5), Audio(chunks=2),
                       TurnComplete()], reply=())]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking, timeout=12)
        await ctl.settle()

    run = await run_call(urgent, scripts, drive)

    assert_server_clean(run)
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    ran = assert_ran_once(run, "c1")
    assert run.at("tool.call_deferred", call_id="c1") < run.at("tool.call_started", call_id="c1")
    stop = run.tap.first_stop_after(run.connections[0].sent[10].at)
    assert stop is not None and 0 <= ran["t"] - stop < 1.0, (
        f"the deferred call ran {ran['t'] - stop:.3f} s after the bot stopped")
    assert_log_settled(run)
    await assert_chain_ok(run)


async def test_a_tool_calls_two_write_ahead_commits_are_urgent(urgent):
    """With inline="urgent" (SQLite), exactly the commits a tool call waits for (its start;
    its result with the send intent) commit on the loop's thread; the rest on the writer."""
    scripts = [Script([ToolCall(Call("c1", ORDER, {"id": 1})), WaitToolResponse("c1"),
                       Audio(chunks=2), TurnComplete()], reply=())]
    run = await run_call(urgent, scripts, until_quiet, policy=Policy(defer="none"))
    assert_answered_once(run, "c1", ORDER, via="tool_response", connection=0)
    stats = urgent.store.stats
    assert stats["inline"] == 2 and stats["batches"] > 2, stats
    assert_log_settled(run)
