"""Stored payloads the store never writes (NaN or Infinity; a lone surrogate; nesting deeper
than MAX_NESTING), through every tool: corrupt rows.

The store's canonical JSON refuses non-finite numbers and text that is not valid Unicode,
but Python's JSON reader takes `NaN`, `Infinity` and an escaped lone surrogate (`\\ud800`),
so a row edited by hand or written by other code decoded as if it were fine. The tools then
printed `NaN` into their JSON (which no JSON reader takes), or failed to write the surrogate
at all (a UnicodeEncodeError traceback from every command but verify, which said ok; the
viewer's answers a bare 500 or a dropped connection). Such a row is now corrupt, named and
flagged like any row that is not valid JSON. Both databases.
"""

from __future__ import annotations

import json

import pytest

from tests.store.helpers import insert_raw_event

from .conftest import running_viewer, viewer_client
from .helpers import T0, acli, support_call, write_call

N = 24  # good events before the bad row
CALL = "odd-payload-1"
ROW = f"{CALL}@{N + 1}"
PAYLOADS = {
    "non_finite": ("tool.call_requested", '{"args":{"qty":NaN,"limit":Infinity},'
                   '"call_id":"c9","generation":3,"name":"lookup_order"}'),
    "lone_surrogate": ("conversation.message",
                       '{"generation":3,"role":"user","text":"caf\\u00e9 \\ud800 ok"}'),
    # Python decodes it, and every reader then walked it recursively (timeline, state,
    # export, --redact: RecursionError tracebacks); the store refuses it (MAX_NESTING).
    "too_deep": ("tool.call_completed",
                 '{"call_id":"c1","result":' + "[" * 900 + "]" * 900 + "}"),
}


def strict(text: str):
    """JSON as every other reader reads it: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(params=list(PAYLOADS))
async def odd_log(request, migrated):
    etype, payload = PAYLOADS[request.param]
    await write_call(migrated, CALL, support_call()[:N])
    await insert_raw_event(migrated, CALL, etype, 1, payload, at_us=T0 + 6_000_000)
    await insert_raw_event(migrated, CALL, "conversation.message", 1,
                           '{"generation":3,"role":"user","text":"still there?"}',
                           at_us=T0 + 7_000_000)
    return migrated


async def test_such_a_row_is_corrupt_in_the_cli(odd_log):
    for command in (["timeline", CALL, "--json"], ["state", CALL, "--json"],
                    ["timeline", CALL], ["state", CALL]):
        r = await acli(*command, backend=odd_log)
        assert r.exit_code == 2 and ROW in r.stderr.replace("\n", ""), (command, r.output)
    window = await acli("timeline", CALL, "--from", str(N), "--limit", "3", "--json",
                        backend=odd_log)
    assert window.exit_code == 0, window.output
    bad = strict(window.stdout)["entries"][1]
    assert (bad["version"], bad["level"]) == (N + 1, "error")
    # The window says its facts are its own: the call cannot be folded whole.
    assert strict(window.stdout)["problems"][0]["kind"] == "whole_call_unreadable"
    export = await acli("export", CALL, backend=odd_log)
    assert export.exit_code == 0, export.output
    lines = [strict(x) for x in export.stdout.splitlines()]
    assert [x["version"] for x in lines] == list(range(1, N + 3))  # nothing skipped
    assert "_unreadable" in lines[N]["data"] and lines[N]["redacted"] == ["data"]
    verify = await acli("verify", CALL, backend=odd_log)
    assert verify.exit_code == 1 and f"first bad event version {N + 1}" in verify.stdout
    replay = await acli("replay", CALL, backend=odd_log)
    assert replay.exit_code == 2 and ROW in replay.stdout.replace("\n", ""), replay.output


async def test_such_a_row_is_never_a_bare_500_in_the_viewer(odd_log):
    with running_viewer(odd_log) as base:
        async with viewer_client(base) as http:
            page = await http.get(f"/calls/{CALL}")
            assert page.status_code == 500 and ROW in page.text, page.text[:300]
            for api in ("timeline", "state"):
                r = await http.get(f"/api/{api}/{CALL}")
                assert r.status_code == 500, (api, r.status_code)
                assert ROW in strict(r.text)["error"], (api, r.text[:300])
            window = await http.get(f"/api/timeline/{CALL}", params={"from": N, "n": 3})
            assert window.status_code == 200, window.text[:300]
            assert strict(window.text)["entries"][1]["level"] == "error"
            assert strict(window.text)["problems"][0]["kind"] == "whole_call_unreadable"
            export = await http.get(f"/export/{CALL}")
            assert [strict(x)["version"] for x in export.text.splitlines()] == \
                list(range(1, N + 3))
