"""The crash harness itself: a case passes only if its kills really happened where planned."""

from __future__ import annotations

import asyncio

import pytest

from rig.crash.case import Kill, run_case
from rig.crash.harness import Databases, boundary_kills
from rig.crash.scenarios import SCENARIOS, ServerPlan
from service.local_live import LocalLiveServer
from session_store import open_store
from tests.local_live.helpers import receive_until, turn_complete
from tests.local_live.test_profiles import connect, kinds, text_turn

pytestmark = pytest.mark.timeout(120)


async def test_a_planned_kill_that_never_fired_fails_the_case(tmp_path):
    """A kill point the first worker never reached (here: a tool the call never runs) left
    a clean run that passed as a crash case (kills 0, no violation): a scenario could claim
    a kill point it never exercised."""
    url, _ = await Databases("sqlite", tmp_path)()
    result = await run_case("single_call", url, kills=[Kill(in_tool="refund_order")],
                            workdir=tmp_path)
    assert result.kills == 0
    assert any("never fired" in v for v in result.violations), result.violations


async def test_the_harness_records_where_each_kill_fired(tmp_path):
    """A kill "after v4" lands after the append that reaches v4, which may hold more events:
    the case says where the worker really died."""
    url, _ = await Databases("sqlite", tmp_path)()
    result = await run_case("single_call", url, kills=[Kill(at_version=4)], workdir=tmp_path)
    assert result.ok, result.violations
    assert result.kills == 1 and len(result.kills_fired) == 1, result.kills_fired
    assert result.kills_fired[0].startswith("after v4: died at v"), result.kills_fired


async def test_the_boundaries_are_the_clean_runs_commits(tmp_path):
    """One kill per commit: a kill after any version inside a commit lands after the whole
    commit, so the versions of one commit were one case run many times over."""
    url, _ = await Databases("sqlite", tmp_path)()
    result = await run_case("single_call", url, workdir=tmp_path)
    assert result.ok, result.violations
    store = await open_store(url)
    try:
        records = await store.read(result.call_id)
    finally:
        await store.close()
    stamps = {r.version: r.recorded_at_us for r in records}
    ends = result.commit_ends
    assert ends[-1] == len(records) and ends == sorted(set(ends))
    assert 1 < len(ends) < len(records), "a real call commits several events together"
    for first, last in zip([0, *ends], ends):
        assert len({stamps[v] for v in range(first + 1, last + 1)}) == 1  # one commit
        assert last == len(records) or stamps[last + 1] != stamps[last]  # ends there
    kills = boundary_kills("single_call", ends)
    assert [k[0].at_version for k in kills if k[0].at_version] == ends


async def test_a_fresh_session_says_nothing_until_its_late_seed():
    """The crash scenarios' model plans a fresh session once its seed has arrived, however
    late (a real model says nothing before its first input): had it spoken first, Gemini
    3.1 would refuse the seed (1007), a violation of the harness's making."""
    plan = ServerPlan(SCENARIOS["single_call"])
    async with LocalLiveServer(plan.script) as server:
        async with connect(server, "3.1") as session:
            connection = await server.wait_for_connection(0)
            await asyncio.sleep(1.5)
            assert connection.model_output_at is None, "the model spoke before any input"
            await session.send_client_content(turns=[text_turn("Where is my order 42?")],
                                              turn_complete=True)
            messages = await receive_until(
                session, lambda m: bool(m.tool_call) or turn_complete(m), timeout=10)
            assert any(m.tool_call for m in messages), [m.model_dump(exclude_none=True)
                                                        for m in messages]
    assert kinds(server) == []
