"""The support workbench: a window states the whole call's facts, crashes vs hand-overs,
"sent" vs "in the model", finding calls, timeline filters, `tail`, fleet stats."""

from __future__ import annotations

import asyncio
import json
import threading


from session_store import events as ev
from session_store.audit import build_timeline, queries
from session_store.audit.queries import follow
from session_store.audit.text import timeline_view
from session_store.audit.timeline import KINDS
from session_store.projection import fold

from .helpers import HOUR_US, T0, acli, chain, cli, failing_call, support_call, write_call


def out_json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ----------------------------------------------------------------------------- windows

async def test_a_window_states_the_whole_calls_facts(loaded):
    """`timeline C --from 18 --limit 4` said c1 was "completed, not delivered" (it was sent
    at v14) and a window after the takeover showed a reconnect "None → 3"."""
    window = out_json(await acli("timeline", "support-1", "--from", "18", "--limit", "4",
                                 "--json", backend=loaded))
    [c1] = window["tool_calls"]
    assert (c1["name"], c1["outcome"], c1["sent_at"] is not None, c1["in_model"]) == (
        "lookup_order", "completed", True, True)
    assert c1["args"]["order_id"] == 42 and c1["deferred"] and c1["wait_ms"] == 1120.0
    assert [s["confirmed"] for s in c1["sends"]] == [True, True]
    assert window["entries"][0]["summary"].endswith("(sent again)")
    text = (await acli("timeline", "support-1", "--from", "18", "--limit", "4",
                       backend=loaded)).stdout
    assert "not sent" not in text and "not delivered" not in text
    late = out_json(await acli("timeline", "support-1", "--from", "24", "--json",
                               backend=loaded))
    [reconnect] = late["reconnects"]
    assert (reconnect["from_generation"], reconnect["generation"], reconnect["reason"]) == (
        2, 3, "takeover")
    assert "None" not in (await acli("timeline", "support-1", "--from", "24",
                                     backend=loaded)).stdout
    # a window inside a bot turn: the turn began before it
    mid = out_json(await acli("timeline", "support-1", "--from", "8", "--limit", "2",
                              "--json", backend=loaded))
    assert mid["speech"][0]["start"] is None and mid["speech"][0]["generation"] == 1


async def test_the_viewers_window_states_the_whole_calls_facts(loaded):
    import httpx

    from .conftest import running_viewer, viewer_client

    with running_viewer(loaded) as base:
        async with viewer_client(base) as http:
            page = (await http.get("/calls/support-1", params={"from": 11, "n": 10})).text
            tools = page.split('id="tool-calls"')[1]
            assert "lookup_order" in tools
            assert "not sent" not in tools and "yes (spoke v19)" in tools
            api = (await http.get("/api/timeline/support-1", params={"from": 15, "n": 3})).json()
            assert api["tool_calls"][0]["name"] == "lookup_order"


# ----------------------------------------------------------------------------- words

def test_sent_is_not_in_the_model_without_evidence():
    """A write that returned is "sent"; "in the model" needs a sign after it: a handle issued
    on that session, or the model's reaction there."""
    opened = [(0, ev.SessionOpened("gemini-live", ["book"], "w1", 1)), (0, ev.Connected(1)),
              (100, ev.ToolCallRequested("c1", "book", {}, 1)),
              (110, ev.ToolCallStarted("c1", 1, "k", 1)),
              (200, ev.ToolCallCompleted("c1", "ok")),
              (210, ev.ToolResultSending("c1", 1, "tool_response")),
              (220, ev.ToolResultSent("c1", 1, "tool_response"))]

    def c1(timed):
        recs = chain("words-1", timed)
        return build_timeline(recs, final_state=fold(recs)).tool_calls["c1"]

    sent = c1(opened)
    assert (sent.in_model, sent.in_model_words) == (None, "not shown")
    handle = c1(opened + [(300, ev.HandleIssued(1, "h-9", 4))])
    assert (handle.in_model, handle.in_model_words) == (True, "yes (handle v8)")
    reply = c1(opened + [(300, ev.ConversationMessage("assistant", "Booked.", 1))])
    assert reply.in_model_words == "yes (wrote v8)"
    user = c1(opened + [(300, ev.ConversationMessage("user", "Hello?", 1))])
    assert user.in_model is None  # the caller speaking is no sign the model read it
    # the session it went to was replaced before any sign: fresh session, result lost
    lost = c1(opened + [(300, ev.Disconnected(1, "error", "reset")), (400, ev.Connected(2)),
                        (500, ev.BotStartedSpeaking(2))])
    assert (lost.in_model, lost.in_model_words) == (False, "NO")
    text = _render(timeline_view(build_timeline(chain("words-1", opened),
                                                final_state=fold(chain("words-1", opened)))))
    assert "result sent via tool_response" in text and "delivered" not in text


def _render(renderable) -> str:
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


# ----------------------------------------------------------------------------- takeovers

def planned_call() -> list:
    """A deploy: the old worker ends its live session (shutdown) without ending the call;
    the new one takes over."""
    return [(0, ev.SessionOpened("gemini-live", [], "w1", 1)), (0, ev.Connected(1)),
            (500, ev.Disconnected(1, "shutdown")),
            (700, ev.WorkerAttached("w2", 2, "takeover")), (900, ev.Connected(2)),
            (1000, ev.SessionClosed("ended"))]


async def test_takeovers_are_crashes_or_planned_hand_overs(migrated):
    await write_call(migrated, "crash-1", support_call())
    await write_call(migrated, "deploy-1", planned_call(), T0 + HOUR_US)
    tl = out_json(await acli("timeline", "deploy-1", "--json", backend=migrated))
    [t] = tl["takeovers"]
    assert (t["kind"], t["previous_worker"], t["last_event_version"], t["silent_ms"]) == (
        "planned", "w1", 3, 200.0)
    assert tl["entries"][2]["flags"] == ["last_of_worker"]
    assert tl["entries"][3]["flags"] == ["takeover_planned"]
    crash = out_json(await acli("timeline", "crash-1", "--json", backend=migrated))
    assert crash["takeovers"][0]["kind"] == "crash"
    assert crash["entries"][21]["flags"] == ["last_of_worker"]
    listed = {c["call"]: c for c in out_json(await acli("calls", "--json",
                                                        backend=migrated))["calls"]}
    assert (listed["deploy-1"]["crashes"], listed["deploy-1"]["handovers"]) == (0, 1)
    assert (listed["crash-1"]["crashes"], listed["crash-1"]["handovers"]) == (1, 0)
    stats = out_json(await acli("stats", "--json", "--since", "3000d", backend=migrated))
    assert stats["takeovers"] == {"crash": 1, "planned": 1}
    text = (await acli("timeline", "deploy-1", backend=migrated)).stdout
    assert "planned hand-over" in text and "last event of this worker" in text


# ----------------------------------------------------------------------------- finding calls

async def test_finding_calls_by_what_was_said_and_done(loaded):
    await write_call(loaded, "deploy-1", planned_call(), T0 + 2 * HOUR_US)

    async def ids(*args):
        data = out_json(await acli("calls", "--json", *args, backend=loaded))
        return [c["call"] for c in data["calls"]]

    assert await ids("--text", "WHERE IS MY ORDER") == ["support-1"]  # transcripts, any case
    assert await ids("--text", "bob@example") == ["support-1"]  # tool arguments too
    assert await ids("--text", "shipped") == ["support-1"]  # and results
    assert await ids("--text", "timeout after") == ["failing-1"]  # and errors
    assert await ids("--text", "no such words") == []
    assert await ids("--tool", "lookup_order") == ["failing-1", "support-1"]
    assert await ids("--tool", "lookup") == []  # a tool's name, not part of it
    assert await ids("--failed") == ["failing-1"]
    assert await ids("--anomaly") == ["failing-1"]
    assert await ids("--takeover") == ["deploy-1", "support-1"]
    assert await ids("--min-duration", "4s") == ["support-1"]
    assert await ids("--max-duration", "500ms") == ["live-1"]
    assert await ids("--sort", "longest") == ["support-1", "failing-1", "deploy-1", "live-1"]
    assert await ids("--sort", "oldest", "--limit", "2") == ["support-1", "failing-1"]
    assert await ids("--sort", "oldest", "--limit", "2", "--after", "failing-1") == [
        "deploy-1", "live-1"]
    # (a key is searched as well: failing-1's arguments have "order_id")
    assert await ids("--sort", "most-events", "--text", "order") == ["support-1", "failing-1"]
    bad = await acli("calls", "--sort", "loudest", backend=loaded)
    assert bad.exit_code == 2 and "unknown sort" in bad.stderr


async def test_the_viewer_finds_calls_the_same_way(loaded):
    import httpx

    from .conftest import running_viewer, viewer_client

    with running_viewer(loaded) as base:
        async with viewer_client(base) as http:
            found = await http.get("/", params={"text": "where is my order"})
            assert "1 call matches" in found.text and 'href="/calls/support-1"' in found.text
            api = (await http.get("/api/calls", params={"tool": "lookup_order",
                                                        "sort": "oldest"})).json()
            assert [c["call"] for c in api["calls"]] == ["support-1", "failing-1"]


# ----------------------------------------------------------------------------- timeline

async def test_timeline_filters_lanes_and_types_and_takes_a_time(loaded):
    tools = out_json(await acli("timeline", "support-1", "--lane", "tools", "--json",
                                backend=loaded))
    assert {e["lane"] for e in tools["entries"]} == {"tools"}
    assert len(tools["tool_calls"]) == 1  # the facts stay whole
    sent = out_json(await acli("timeline", "support-1", "--type", "tool.result_sent,speech.",
                               "--json", backend=loaded))
    assert [e["version"] for e in sent["entries"]] == [5, 10, 14, 18, 19, 20]
    at_offset = out_json(await acli("timeline", "support-1", "--at", "+1.5s", "--limit", "2",
                                    "--json", backend=loaded))
    assert [e["version"] for e in at_offset["entries"]] == [10, 11]
    at_time = out_json(await acli("timeline", "support-1", "--at", "2026-01-01T00:00:02.2Z",
                                  "--limit", "1", "--json", backend=loaded))
    assert at_time["entries"][0]["version"] == 17
    state = out_json(await acli("state", "support-1", "--at", "+1.85s", "--json",
                                backend=loaded))
    assert state["version"] == 14 and state["event"]["type"] == "tool.result_sent"
    bad = await acli("timeline", "support-1", "--lane", "nope", backend=loaded)
    assert bad.exit_code == 2 and "unknown lane" in bad.stderr
    bad = await acli("state", "support-1", "--at", "soon", backend=loaded)
    assert bad.exit_code == 2 and "not a point in a call" in bad.stderr


def test_a_type_without_its_own_entry_is_shown_generically(monkeypatch):
    """New catalogue types (the lead adds Gemini 3 ones) render from their fields until they
    get an entry in KINDS; they are no problem. A type the catalogue lacks is one."""
    monkeypatch.delitem(KINDS, "connection.go_away")
    recs = chain("generic-1", [(0, ev.SessionOpened("m", [], "w", 1)), (0, ev.Connected(1)),
                               (10, ev.GoAwayReceived(1, 30.0))])
    tl = build_timeline(recs)
    e = tl.entries[2]
    assert (e.lane, e.level, e.summary) == ("connection", "info",
                                            "connection.go_away: generation 1, time_left_s 30.0")
    assert tl.problems == []


# ----------------------------------------------------------------------------- tail

async def test_tail_shows_the_last_lines_follows_and_ends_with_the_call(migrated, monkeypatch):
    """`tail CALL` shows the last 10 events (`-n N`: N; `--from-now`: none), follows the call
    live in the timeline's words, and ends when the call closes."""
    cases = {"tail-a": (["-n", "2"], ["v7", "v8"]), "tail-b": (["--from-now"], []),
             "tail-c": ([], [f"v{v}" for v in range(1, 9)])}
    for call in cases:
        await write_call(migrated, call, failing_call())
    r = await acli("tail", "tail-a", "-n", "2", "--from-now", backend=migrated)
    assert r.exit_code == 2 and "do not go together" in r.stderr
    # Appended before tail has read where it starts, the events would come before its start
    # (with --from-now, not shown at all): wait until it follows.
    following = threading.Event()

    def follow_once_started(*args, **kwargs):
        following.set()
        return follow(*args, **kwargs)

    monkeypatch.setattr(queries, "follow", follow_once_started)
    store = await migrated.open()
    try:
        for call, (args, shown) in cases.items():
            result: dict = {}
            following.clear()
            runner = threading.Thread(target=lambda: result.update(
                r=cli("tail", call, *args, backend=migrated)))
            runner.start()
            assert await asyncio.to_thread(following.wait, 30), result
            await asyncio.sleep(0.2)  # (it follows; nothing ends it but the call's close)
            assert runner.is_alive(), result
            await store.append(call, [ev.ConversationMessage("user", "still there?", 1),
                                      ev.SessionClosed("ended")], 8)
            runner.join(20)
            assert not runner.is_alive(), "tail did not end when the call closed"
            lines = result["r"].stdout.splitlines()
            assert [x.split()[1].split("@")[1] for x in lines] == shown + ["v9", "v10"], (
                args, lines)
            assert "user: still there?" in lines[-2] and "session closed" in lines[-1]
    finally:
        await store.close()


async def test_tail_of_a_closed_call_prints_and_ends(loaded):
    r = await acli("tail", "support-1", backend=loaded)
    lines = r.stdout.splitlines()
    assert r.exit_code == 0 and len(lines) == 10 and "session closed: ended" in lines[-1]
    assert "support-1@v16 connection   reconnected: generation 2" in lines[0]


# ----------------------------------------------------------------------------- stats

async def test_fleet_stats(loaded):
    stats = out_json(await acli("stats", "--json", "--since", "2026-01-01T00:00:00Z",
                                "--until", "2026-01-01T03:00:00Z", backend=loaded))
    assert stats["calls"] == 2
    assert [h["calls"] for h in stats["calls_per_hour"]] == [1, 1, 0]
    assert stats["calls_per_hour"][0]["hour"] == "2026-01-01T00:00:00+00:00"
    assert stats["takeovers"] == {"crash": 1, "planned": 0}
    assert stats["anomalies"] == {"total": 1, "by_kind": {"duplicate_tool_call_id": 1}}
    assert stats["in_doubt_calls"] == []
    assert stats["tool_wait_ms"] == {"count": 2, "p50": 20.0, "p90": 1120.0, "p99": 1120.0,
                                     "max": 1120.0}
    assert stats["result_send_ms"] == {"count": 2, "p50": 20.0, "p90": 20.0, "p99": 20.0,
                                       "max": 20.0}
    text = (await acli("stats", "--since", "2026-01-01T00:00:00Z", "--until",
                       "2026-01-01T03:00:00Z", backend=loaded)).stdout
    assert "takeovers: 1 after a crash, 0 planned hand-overs" in text
    assert "tool wait (requested → started)" in text
    bad = await acli("stats", "--since", "1h", "--until", "2h", backend=loaded)
    assert bad.exit_code == 2 and "before --until" in bad.stderr


async def test_in_doubt_calls_are_named(migrated, n=3):
    for i in range(n):
        await write_call(migrated, f"doubt-{i}", [
            (0, ev.SessionOpened("gemini-live", ["book"], "w1", 1)), (0, ev.Connected(1)),
            (100, ev.ToolCallRequested("c1", "book", {}, 1)),
            (110, ev.ToolCallStarted("c1", 1, "k", 1)),
            (500, ev.WorkerAttached("w2", 2, "takeover")),
            (600, ev.ToolCallFailed("c1", "in doubt", True))], T0 + i * 1000)
    # One its tool's outcome check settled (done): it was in doubt all the same.
    await write_call(migrated, "doubt-checked", [
        (0, ev.SessionOpened("gemini-live", ["book"], "w1", 1)), (0, ev.Connected(1)),
        (100, ev.ToolCallRequested("c1", "book", {}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "k", 1)),
        (500, ev.WorkerAttached("w2", 2, "takeover")),
        (600, ev.ToolOutcomeChecked("c1", "done")),
        (600, ev.ToolCallCompleted("c1", {"booked": True}))], T0 + n * 1000)
    stats = out_json(await acli("stats", "--json", "--since", "3000d", backend=migrated))
    assert stats["in_doubt_calls"] == sorted([f"doubt-{i}" for i in range(n)]
                                             + ["doubt-checked"])
