"""The crash harness itself: a case passes only if its kills really happened where planned."""

from __future__ import annotations

import pytest

from service.crash.case import Kill, run_case
from service.crash.harness import Databases

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
