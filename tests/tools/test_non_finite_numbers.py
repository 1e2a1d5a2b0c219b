"""A stored payload with NaN or Infinity in it: a corrupt row, through every tool.

The store never writes one (canonical JSON refuses non-finite numbers), but Python's JSON
reader takes `NaN` and `Infinity`, so a row edited by hand or written by other code decoded
as if it were fine: the tools then printed `NaN` into their JSON (which no JSON reader
takes) and the viewer's JSON answers failed with a bare 500. Such a row is now corrupt, named
and flagged like any row that is not valid JSON. Both databases.
"""

from __future__ import annotations

import json

import httpx

from tests.store.helpers import insert_raw_event

from .conftest import running_viewer
from .helpers import T0, acli, support_call, write_call

N = 24  # good events before the bad row
CALL = "nonfinite-1"
ROW = f"{CALL}@{N + 1}"
PAYLOAD = ('{"args":{"qty":NaN,"limit":Infinity},"call_id":"c9","generation":3,'
           '"name":"lookup_order"}')


def strict(text: str):
    """JSON as every other reader reads it: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


async def _log(backend):
    await write_call(backend, CALL, support_call()[:N])
    await insert_raw_event(backend, CALL, "tool.call_requested", 1, PAYLOAD,
                           at_us=T0 + 6_000_000)
    await insert_raw_event(backend, CALL, "conversation.message", 1,
                           '{"generation":3,"role":"user","text":"still there?"}',
                           at_us=T0 + 7_000_000)


async def test_a_non_finite_number_makes_a_row_corrupt_in_the_cli(migrated):
    await _log(migrated)
    for command in (["timeline", CALL, "--json"], ["state", CALL, "--json"]):
        r = await acli(*command, backend=migrated)
        assert r.exit_code == 2 and ROW in r.stderr.replace("\n", ""), (command, r.output)
    window = await acli("timeline", CALL, "--from", str(N), "--limit", "3", "--json",
                        backend=migrated)
    assert window.exit_code == 0, window.output
    bad = strict(window.stdout)["entries"][1]
    assert (bad["version"], bad["level"]) == (N + 1, "error")
    export = await acli("export", CALL, backend=migrated)
    lines = [strict(x) for x in export.stdout.splitlines()]
    assert [x["version"] for x in lines] == list(range(1, N + 3))  # nothing skipped
    assert "_unreadable" in lines[N]["data"] and lines[N]["redacted"] == ["data"]
    verify = await acli("verify", CALL, backend=migrated)
    assert verify.exit_code == 1 and f"first bad event version {N + 1}" in verify.stdout


async def test_a_non_finite_number_is_never_a_bare_500_in_the_viewer(migrated):
    await _log(migrated)
    with running_viewer(migrated) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            for api in ("timeline", "state"):
                r = await http.get(f"/api/calls/{CALL}/{api}")
                assert r.status_code == 500, (api, r.status_code)
                assert ROW in strict(r.text)["error"], (api, r.text[:300])
            window = await http.get(f"/api/calls/{CALL}/timeline", params={"from": N, "n": 3})
            assert window.status_code == 200, window.text[:300]
            assert strict(window.text)["timeline"]["entries"][1]["level"] == "error"
            export = await http.get(f"/calls/{CALL}/export.jsonl")
            assert [strict(x)["version"] for x in export.text.splitlines()] == \
                list(range(1, N + 3))
