import json, httpx
from session_store import events as ev
from tests.tools.conftest import running_viewer
from tests.tools.helpers import acli, support_call, write_call, T0

async def test_probe(migrated):
    await write_call(migrated, "one-1", [(0, ev.SessionOpened("m", ["t"], "w", 1))])
    await write_call(migrated, "support-1", support_call())
    for cmd in (["timeline", "one-1"], ["state", "one-1"], ["replay", "one-1"], ["export", "one-1"],
                ["timeline", "support-1", "--from", "-5", "--limit", "3"],
                ["timeline", "support-1", "--from", "1000"],
                ["timeline", "support-1", "--from", "20", "--limit", "-3"],
                ["state", "support-1", "--at", "-4"],
                ["state", "support-1", "--at", "1000"],
                ["verify", "--json"]):
        r = await acli(*cmd, backend=migrated)
        print("###", cmd, r.exit_code, r.stdout[:700], r.stderr[:300])
    with running_viewer(migrated) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            for p in ("/calls/one-1", "/api/calls/one-1/timeline", "/api/calls/one-1/state", "/api/calls/one-1/replay", "/calls/one-1/export.jsonl",
                      "/calls/support-1?from=24&n=0", "/api/calls/support-1/state?at=-1", "/api/calls/support-1/replay?defer=,,,&idempotent=%00"):
                r = await http.get(p)
                print("###", p, r.status_code, r.text[:150])
