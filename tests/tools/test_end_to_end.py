"""End to end: tampering is caught, the tools read what the real store writes, tail follows."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

from session_store import events as ev

from .conftest import sql
from .helpers import SECRET, acli, support_call

REPO = Path(__file__).resolve().parents[2]


async def test_an_edited_row_fails_verify_and_is_named(loaded):
    await sql(loaded, "UPDATE session_events SET data = :d WHERE stream_id = :s AND version = :v",
              d='{"call_id":"c1","result":{"status":"cancelled"}}', s="support-1", v=12)
    r = await acli("verify", "support-1", backend=loaded)
    assert r.exit_code == 1
    assert "BAD  support-1: first bad event version 12" in r.stdout
    assert "hash mismatch" in r.stdout
    data = json.loads((await acli("verify", "--json", backend=loaded)).stdout)
    assert data["ok"] is False
    bad = {s["call"]: s for s in data["calls"]}
    assert bad["support-1"]["first_bad_version"] == 12 and not bad["support-1"]["ok"]
    assert bad["failing-1"]["ok"] and bad["live-1"]["ok"]
    assert (await acli("verify", backend=loaded)).exit_code == 1
    assert (await acli("verify", "failing-1", backend=loaded)).exit_code == 0



async def test_verify_names_the_bad_events_version_and_position(loaded, store):
    """The report names both the call's version and the log's position of the first bad
    event (they differ for every call but the first one written)."""
    position = next(r.position for r in await store.read("failing-1") if r.version == 5)
    assert position != 5
    await sql(loaded, "UPDATE session_events SET data = :d WHERE stream_id = :s AND version = :v",
              d='{"call_id":"c1","error":"edited"}', s="failing-1", v=5)
    r = await acli("verify", "failing-1", backend=loaded)
    assert r.exit_code == 1
    assert f"BAD  failing-1: first bad event version 5 (position {position}):" in r.stdout
    [report] = json.loads((await acli("verify", "failing-1", "--json",
                                      backend=loaded)).stdout)["calls"]
    assert (report["first_bad_version"], report["first_bad_position"]) == (5, position)

async def test_a_deleted_row_fails_verify(loaded):
    await sql(loaded, "DELETE FROM session_events WHERE stream_id = :s AND version = 5",
              s="support-1")
    r = await acli("verify", "support-1", "--json", backend=loaded)
    assert r.exit_code == 1
    [report] = json.loads(r.stdout)["calls"]
    assert report["first_bad_version"] == 5 and "missing" in report["reason"]


async def test_export_of_a_damaged_call_writes_every_stored_row_past_a_gap(migrated):
    """A damaged call is exported all the same, then refused (exit 2): every stored row, also
    those after a gap at the end of one of export's chunks of 5,000 versions (the export
    took the short chunk for the end of the call and left the rest of it out)."""
    from session_store.records import RecordedEvent

    from .helpers import chain, write_records

    timed = [(0, ev.SessionOpened("gemini-live", ["lookup"], "w1")), (0, ev.Connected(1))]
    timed += [(i, ev.ConversationMessage("user", f"turn {i}", 1)) for i in range(5008)]
    recs: list[RecordedEvent] = chain("gap-1", timed)
    await write_records(migrated, {"gap-1": recs})
    await sql(migrated, "DELETE FROM session_events WHERE stream_id = :s AND version >= 4999 "
                        "AND version <= 5000", s="gap-1")
    r = await acli("export", "gap-1", backend=migrated)
    assert r.exit_code == 2 and "is damaged" in r.stderr, r.stderr
    versions = [json.loads(x)["version"] for x in r.stdout.splitlines()]
    assert versions == [*range(1, 4999), *range(5001, 5011)], (len(versions), versions[-3:])



async def test_a_row_moved_past_the_head_is_damage_even_when_the_count_matches(migrated):
    """Row 10 deleted and a row written behind the head (version 26 of a 25-event head): the
    call still holds 25 rows, but not versions 1..25. Every reader refuses it (exit 2), and
    export says so after writing what is stored (it is not the whole call)."""
    from tests.store.helpers import insert_raw_event

    from .helpers import write_call

    await write_call(migrated, "moved-1", support_call())
    head = (await sql(migrated, "SELECT version, last_hash FROM session_streams "
                                "WHERE stream_id = 'moved-1'"))[0]
    await insert_raw_event(migrated, "moved-1", "conversation.message", 1,
                           '{"generation":3,"role":"user","text":"added later"}')
    await sql(migrated, "UPDATE session_streams SET version = :v, last_hash = :h "
                        "WHERE stream_id = 'moved-1'", v=head[0], h=head[1])
    await sql(migrated, "DELETE FROM session_events WHERE stream_id = 'moved-1' AND version = 10")
    for command in (["export", "moved-1"], ["timeline", "moved-1"], ["state", "moved-1"]):
        r = await acli(*command, backend=migrated)
        assert r.exit_code == 2 and "is damaged" in r.stderr, (command, r.output)

async def test_tools_read_what_the_store_writes(store, migrated):
    """The real append path (group commit, real clock): one append per decision or effect."""
    groups: list[list] = []
    for (offset, e) in support_call():
        same = groups and e.TYPE in ("tool.call_deferred", "connection.reconnect_requested")
        (groups[-1].append(e) if same else groups.append([e]))
    version, epoch = 0, None
    for group in groups:
        # As a worker does: its epoch with every append, the takeover's from the takeover on.
        epoch = max([epoch or 0, *(getattr(e, "epoch", 0) for e in group
                                   if e.TYPE in ("session.opened", "session.worker_attached"))])
        version = await store.append("support-1", group, version, epoch=epoch or None)
    r = await acli("replay", "support-1", "--json", backend=migrated)
    assert r.exit_code == 0, r.stdout
    assert json.loads(r.stdout)["divergences"] == []
    assert (await acli("verify", "support-1", backend=migrated)).exit_code == 0
    [row] = json.loads((await acli("calls", "--json", backend=migrated)).stdout)["calls"]
    assert (row["call"], row["events"], row["tool_calls"], row["reconnects"], row["takeovers"],
            row["status"]) == ("support-1", 25, 1, 2, 1, "closed")
    tl = json.loads((await acli("timeline", "support-1", "--json", backend=migrated)).stdout)
    assert tl["tool_calls"][0]["in_model"] is True and tl["problems"] == []


async def test_the_demo_call_through_every_command(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'demo.db'}"
    r = await acli("demo", "--db", url, "--json")
    assert r.exit_code == 0, r.output
    call = json.loads(r.stdout)["call"]
    db = ["--db", url]
    [row] = json.loads((await acli("calls", "--json", *db)).stdout)["calls"]
    assert row["call"] == call and row["status"] == "closed" and row["tool_calls"] >= 1
    assert (await acli("verify", call, *db)).exit_code == 0
    replayed = await acli("replay", call, "--json", *db)
    assert replayed.exit_code == 0 and json.loads(replayed.stdout)["ok"]
    assert (await acli("timeline", call, *db)).exit_code == 0
    assert (await acli("state", call, "--at", "5", *db)).exit_code == 0
    assert len((await acli("export", call, "--redact", *db)).stdout.splitlines()) == row["events"]


def test_tail_follows_new_events_with_secrets_masked(tmp_path):
    """`tail` in its own process; events appended afterwards show up."""
    import asyncio

    from session_store import open_store
    from session_store.storage.migrate import upgrade

    url = f"sqlite+aiosqlite:///{tmp_path / 'tail.db'}"

    async def write(events, expected):
        await upgrade(url)
        store = await open_store(url)
        try:
            return await store.append("tailed", events, expected)
        finally:
            await store.close()

    asyncio.run(write([ev.SessionOpened("m", ["t"], "w1", 1, {"api_key": SECRET})], 0))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"}
    proc = subprocess.Popen([sys.executable, "-c", "from session_store.commands.cli import main; main()",
                             "tail", "tailed", "--db", url], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        first = lines.get(timeout=20)
        assert "tailed@v1 session      session opened: model m" in first
        assert SECRET not in first
        # When, in UTC and with its date (it was the time of day alone, no zone).
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z tailed@v1 ", first), first
        asyncio.run(write([ev.Connected(1)], 1))
        second = lines.get(timeout=20)
        assert "tailed@v2 connection   connected: generation 1" in second
    finally:
        proc.terminate()
        proc.wait(10)
    proc = subprocess.Popen([sys.executable, "-c", "from session_store.commands.cli import main; main()",
                             "tail", "--json", "--db", url], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
    try:
        first = json.loads(proc.stdout.readline())
        assert (first["version"], first["type"]) == (1, "session.opened")
        assert first["data"]["settings"]["api_key"] == "[REDACTED]"
    finally:
        proc.terminate()
        proc.wait(10)
