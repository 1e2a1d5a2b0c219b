"""Replay sees every decision of the crash harness's calls: each scenario, run by real worker
processes against the local Gemini Live server, once clean and once killed inside a tool, on both
databases. Every decision the log holds is decided again to the same events (the harness's
I9 checks the same on every boundary case); this test also shows which kinds that covers."""

from __future__ import annotations

import pytest

from rig.crash.case import Kill, run_case
from rig.crash.harness import Databases
from rig.crash.invariants import policy_of
from rig.crash.scenarios import SCENARIOS, scripted_for
from rig.testing.pipeline import MODEL
from session_store import open_store
from session_store.audit import replay
from session_store.audit.replay import logged_decisions

pytestmark = pytest.mark.timeout(900)

#: Kinds of observation every run of the scenarios below makes between them.
EXPECTED_KINDS = {"SessionReady", "SessionLeft", "ToolCallsArrived", "SpeechStarted",
                  "SpeechStopped", "SettingsUpdate", "GoAway",
                  "ProgressReturned", "OutcomeAnswered", "HandleArrived"}


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_every_decision_of_every_scenario_is_replayed(db, tmp_path):
    databases = Databases(db, tmp_path)
    kinds: set[str] = set()
    try:
        for name in sorted(scripted_for(MODEL)):
            # Killed between a tool's side effect and its outcome: the next worker finds it
            # in doubt (and asks its outcome check, where the tool has one).
            for kills in ([], [Kill(in_tool=SCENARIOS[name].tool_names[0])]):
                url, schema = await databases()
                result = await run_case(name, url, schema=schema, kills=kills,
                                        workdir=tmp_path, model=MODEL)
                assert result.ok, result.violations
                store = await open_store(url, **({"schema": schema} if schema else {}))
                try:
                    records = await store.read(result.call_id)
                finally:
                    await store.close()
                report = replay(records, policy_of(SCENARIOS[name]))
                decisions = list(logged_decisions(records))
                assert report.ok, (name, kills, report.to_json())
                n = len(decisions)
                assert n and report.coverage == f"{n} of {n} decisions replayed", name
                assert report.decisions_checked == n and not report.reconstructed
                kinds |= {d.kind for d in decisions}
    finally:
        await databases.cleanup()
    assert EXPECTED_KINDS <= kinds, EXPECTED_KINDS - kinds
