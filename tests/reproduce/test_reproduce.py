"""`session-store reproduce`: a logged call re-run offline against today's service.

The logs are real: crash-harness calls (the demo's among them) on SQLite and PostgreSQL,
a worker SIGKILLed mid-call. The reproduction is written by the CLI and run by pytest in a
subprocess, as a support engineer runs it; a mutant service shows its divergence at the
decision that was changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rig.crash.case import Kill, run_case
from service.reproduction import run_reproduction
from session_store.audit.reproduce import decisions, read
from tests.conftest import empty_database

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
DEMO_KILL = [Kill(after_event="tool.result_sending")]  # as `session-store demo` kills


async def _logged_call(backend, tmp_path, scenario: str, kills) -> str:
    await backend.migrate()
    result = await run_case(scenario, backend.url, schema=backend.options.get("schema"),
                            kills=kills, workdir=tmp_path)
    assert result.ok and result.kills == len(kills), (result.violations, result.kills_fired)
    return result.call_id


def _reproduce(backend, call: str, out: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "session_store.commands.cli", "reproduce", call,
                           "--out", str(out), *backend.cli_args],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("scenario,kills", [("prompt_change", DEMO_KILL)])
async def test_a_logged_call_reproduces_green_with_pytest(backend, tmp_path, scenario, kills):
    call = await _logged_call(backend, tmp_path, scenario, kills)
    out = tmp_path / "repro"
    _reproduce(backend, call, out)
    spec, _ = read(out)
    assert len(spec["workers"]) == 2, spec["workers"]  # the takeover is reproduced
    async with empty_database(backend.name, tmp_path / "rerun") as rerun:
        (tmp_path / "rerun").mkdir(exist_ok=True)
        env = {**os.environ, "REPRODUCE_DB": rerun.url,
               **({"REPRODUCE_SCHEMA": rerun.options["schema"]}
                  if "schema" in rerun.options else {})}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-p", "no:randomly", str(out / "test_reproduction.py")],
                              capture_output=True, text=True, cwd=out, env=env, timeout=180)
    found = [x for x in done.stdout.splitlines() if "first divergence" in x or "expected:" in x
             or "actual:" in x]
    assert done.returncode == 0, "\n".join(found[:3]) or done.stdout[-3000:]
    assert "1 passed" in done.stdout


async def test_a_mutant_service_diverges_at_the_decision_it_changed(tmp_path, monkeypatch):
    """Tools no longer deferred while the bot speaks: the first divergence is the log's
    first deferral, and the report names it with what the log and the re-run hold."""
    async with empty_database("sqlite", tmp_path) as backend:
        call = await _logged_call(backend, tmp_path, "prompt_change", DEMO_KILL)
        out = tmp_path / "repro"
        _reproduce(backend, call, out)
    _, lines = read(out)
    deferral = next(d for d in decisions(lines)
                    if any(x["type"] == "tool.call_deferred" for x in d.lines))
    from session_store.policy import Policy

    monkeypatch.setattr(Policy, "defers", lambda self, name, mode="blocking": False)
    result = await run_reproduction(out, f"sqlite+aiosqlite:///{tmp_path / 'mutant.db'}")
    assert result.divergence is not None
    assert (result.divergence.decision.first, result.divergence.decision.last) == (
        deferral.first, deferral.last), result.divergence.message()
    assert any(x["type"] == "tool.call_deferred" for x in result.divergence.expected)
    assert not any(x["type"] == "tool.call_deferred" for x in result.divergence.actual)
    deferred = next(x["version"] for x in deferral.lines if x["type"] == "tool.call_deferred")
    assert result.divergence.version == deferred, result.divergence.message()
    assert (f"at v{deferred} the log has tool.call_deferred, today's service "
            f"tool.call_started") in result.divergence.message()
