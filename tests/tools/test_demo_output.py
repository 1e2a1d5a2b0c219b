"""Issue #35 item 4: what `session-store demo` shows a new user: a call id like their own
(`demo-<hex>`, not the rig's scenario name), the tool table as `timeline` shows it (from the
call's final state: "in model" said, not "not shown"), pipecat's banner once, and the next
commands to try on that call."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "session_store.commands.cli", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})


def test_the_demo_shows_what_timeline_shows_and_what_to_do_next(tmp_path):
    db = str(tmp_path / "demo.db")
    out = _cli("demo", "--db", db)
    assert out.returncode == 0, out.stderr[-3000:]
    [call] = json.loads(_cli("calls", "--db", db, "--json").stdout)["calls"]
    call_id = call["call"]
    assert re.fullmatch(r"demo-[0-9a-f]{12}", call_id), call_id
    assert "prompt_change" not in out.stdout
    banner = "ᓚᘏᗢ Pipecat"
    assert (out.stdout + out.stderr).count(banner) <= 1, out.stderr[-2000:]

    timeline = _cli("timeline", call_id, "--db", db)
    assert timeline.returncode == 0
    tools = json.loads(_cli("timeline", call_id, "--db", db, "--json").stdout)["tool_calls"]
    assert tools
    for c in tools:  # each tool call's row: the same words in the demo and in `timeline`
        [demo_row] = [x for x in out.stdout.splitlines() if x.strip().startswith(c["tool_call_id"] + " ")]
        [tl_row] = [x for x in timeline.stdout.splitlines()
                    if x.strip().startswith(c["tool_call_id"] + " ")]
        assert demo_row.split() == tl_row.split(), (demo_row, tl_row)
        assert "not shown" not in demo_row, demo_row

    steps = out.stdout[out.stdout.index("next:"):]
    assert f"session-store timeline {call_id} --db {db}" in steps
    assert f"session-store export {call_id} --db {db} --redact" in steps
    assert "session-store serve" in steps
