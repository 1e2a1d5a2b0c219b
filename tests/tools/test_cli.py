"""Every CLI command on SQLite and PostgreSQL, with golden --json outputs built here."""

from __future__ import annotations

import json

import pytest

from session_store.audit import MASK
from session_store.events import canonical_json
from session_store.records import GENESIS_HASH, chain_hash

from session_store import events as ev

from .helpers import HOUR_US, SECRET, T0, acli, at, support_call, write_call


def out_json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def summary(call, status, start, last, duration, events, **counts):
    base = {"call": call, "status": status, "start": start, "last_event": last,
            "duration_s": duration, "silent_s": None, "events": events, "epoch": 1,
            "tool_calls": 0, "deferred": 0, "failures": 0, "cancelled": 0, "anomalies": 0,
            "reconnects": 0, "takeovers": 0, "crashes": 0, "handovers": 0,
            "finished_after_end": 0, "in_doubt": 0}
    return {**base, **counts}


async def test_migrate_creates_the_schema(backend):
    r = await acli("migrate", backend=backend)
    assert r.exit_code == 0 and "schema is at head" in r.stdout
    assert out_json(await acli("calls", "--json", backend=backend)) == {
        "calls": [], "next_after": None}


async def test_calls_json_golden(loaded):
    live = loaded.live_t0
    expected = [
        summary("live-1", "open", at(0, live), at(0, live), 0.0, 2),
        summary("failing-1", "stale", at(0, T0 + HOUR_US), at(1000, T0 + HOUR_US), 1.0, 8,
                tool_calls=1, failures=1, anomalies=1),
        summary("support-1", "closed", at(0), at(5000), 5.0, 25, tool_calls=1, deferred=1,
                reconnects=2, takeovers=1, crashes=1, epoch=2),  # (taken over: epoch 2)
    ]
    got = out_json(await acli("calls", "--json", backend=loaded))
    # How long a call not closed has been silent depends on when the test runs.
    silent = [c.pop("silent_s") for c in got["calls"]]
    assert silent[0] >= 2.0 and silent[1] > 24 * 3600 and silent[2] is None
    assert got == {"calls": [{k: v for k, v in c.items() if k != "silent_s"} for c in expected],
                   "next_after": None}


async def test_calls_filters_and_paging(loaded):
    async def ids(*args):
        data = out_json(await acli("calls", "--json", *args, backend=loaded))
        return [c["call"] for c in data["calls"]], data["next_after"]

    assert await ids("--status", "closed") == (["support-1"], None)
    assert await ids("--status", "stale") == (["failing-1"], None)
    assert await ids("--status", "open") == (["live-1"], None)
    assert await ids("--since", "2026-01-01T00:30:00Z") == (["live-1", "failing-1"], None)
    assert await ids("--until", "2026-01-01T00:30:00") == (["support-1"], None)
    assert await ids("--since", "1h") == (["live-1"], None)
    assert await ids("--search", "ail") == (["failing-1"], None)
    assert await ids("--limit", "2") == (["live-1", "failing-1"], "failing-1")
    assert await ids("--limit", "2", "--after", "failing-1") == (["support-1"], None)
    # A page after a call that is not there is an error, not an empty page (read as the end).
    gone = await acli("calls", "--after", "failing-2", backend=loaded)
    assert gone.exit_code == 2 and "there is no call 'failing-2'" in gone.stderr, gone.output
    table = await acli("calls", backend=loaded)
    assert table.exit_code == 0 and "support-1" in table.stdout and "stale" in table.stdout
    bad = await acli("calls", "--status", "crashed", backend=loaded)
    assert bad.exit_code == 2 and "unknown status" in bad.stderr
    margin = await acli("replay", "support-1", "--go-away-margin", "-5", backend=loaded)
    assert margin.exit_code == 2 and "go_away_margin_s must be" in margin.stderr, margin.output
    assert "Traceback" not in margin.output
    # The policy a call ran with, for a call that ends when Gemini is given up.
    ends = await acli("replay", "support-1", "--end-call-on-give-up", "gemini_unreachable",
                      backend=loaded)
    assert ends.exit_code == 0 and "Traceback" not in ends.output, ends.output


SUPPORT_ENTRIES = [
    (1, 0, "session", "info", "session opened: model gemini-live, tools lookup_order, "
                              "send_email, worker w1, epoch 1"),
    (2, 0, "connection", "info", "connected: generation 1, fresh (seeded history)"),
    (3, 100, "connection", "info", "resumption handle h-1 issued on generation 1 "
                                   "(last consumed message 0)"),
    (4, 200, "conversation", "info", "user: Where is my order 42? I am bob@example.com"),
    (5, 300, "speech", "info", "bot started speaking (generation 1)"),
    (6, 400, "tools", "info", 'c1: lookup_order({"auth_token": "[REDACTED]", "email": '
                              '"bob@example.com", "order_id": 42}) requested on generation 1'),
    (7, 400, "tools", "info", "c1: deferred until the bot stops speaking"),
    (8, 500, "settings", "info", 'settings changed: voice = {"voice": "Kore"}; needs a reconnect'),
    (9, 500, "connection", "info", "reconnect requested: settings (voice); "
                                   "buffered until turn end"),
    (10, 1500, "speech", "info", "bot stopped speaking (turn_complete) after 1.2 s"),
    (11, 1520, "tools", "info", "c1: lookup_order started after waiting 1120 ms"),
    (12, 1820, "tools", "info", 'c1: completed in 300 ms: {"password": "[REDACTED]", '
                                '"status": "shipped"}'),
    (13, 1830, "tools", "info", "c1: sending result via tool_response on generation 1"),
    (14, 1840, "tools", "info", "c1: result sent via tool_response on generation 1, "
                                "20 ms after the outcome"),
    (15, 1900, "connection", "warn", "disconnected generation 1: settings"),
    (16, 2100, "connection", "info", "reconnected: generation 2, resumed from handle h-1 "
                                     "(reason: settings)"),
    (17, 2200, "tools", "info", "c1: sending result via content on generation 2"),
    (18, 2210, "tools", "info", "c1: result sent via content on generation 2 (sent again)"),
    (19, 2300, "speech", "info", "bot started speaking (generation 2)"),
    (20, 3000, "speech", "info", "bot stopped speaking (turn_complete) after 0.7 s"),
    (21, 3100, "conversation", "info", "assistant: Your order 42 has shipped."),
    (22, 3200, "connection", "info", "resumption handle h-2 issued on generation 2 "
                                     "(last consumed message 3)"),
    (23, 4000, "session", "warn", "worker w2 took the call over from w1 (crash after 0.80 s "
                                  "of silence since v22; epoch 2)"),
    (24, 4300, "connection", "info", "reconnected: generation 3, resumed from handle h-2 "
                                     "(reason: takeover)"),
    (25, 5000, "session", "info", "session closed: ended"),
]


async def test_timeline_json_golden(loaded):
    tl = out_json(await acli("timeline", "support-1", "--json", backend=loaded))
    assert [(e["version"], e["offset_ms"], e["lane"], e["level"], e["summary"])
            for e in tl["entries"]] == [(v, float(o), lane, lvl, s)
                                        for v, o, lane, lvl, s in SUPPORT_ENTRIES]
    assert [e["at"] for e in tl["entries"]] == [at(o) for _v, o, *_ in SUPPORT_ENTRIES]
    assert tl["tool_calls"] == [{
        "tool_call_id": "c1", "name": "lookup_order",
        "args": {"auth_token": MASK, "email": "bob@example.com", "order_id": 42},
        "generation": 1, "requested_version": 6, "requested_at": at(400), "deferred": True,
        "attempts": [{"attempt": 1, "version": 11, "at": at(1520), "epoch": 1,
                      "idempotency_key": "support-1:c1"}],
        "started_at": at(1520), "wait_ms": 1120.0, "finished_version": 12,
        "finished_at": at(1820), "run_ms": 300.0, "outcome": "completed",
        "result": {"password": MASK, "status": "shipped"}, "error": None,
        "outcome_unknown": False, "reused_from": None, "reissue_of": None,
        "superseded_by": None, "cancel_reason": None,
        "sends": [{"generation": 1, "via": "tool_response", "version": 13, "confirmed": True,
                   "confirmed_version": 14, "at": at(1830), "confirmed_at": at(1840)},
                  {"generation": 2, "via": "content", "version": 17, "confirmed": True,
                   "confirmed_version": 18, "at": at(2200), "confirmed_at": at(2210)}],
        "sent_at": at(1840), "sent_via": "tool_response", "sent_generation": 1,
        "send_ms": 20.0, "in_model": True, "in_model_evidence": {"version": 19, "kind": "spoke"},
        "clipped": False, "mode": "blocking", "scheduling": None, "progress": []}]
    assert tl["reconnects"] == [
        {"reason": "settings", "keys": ["voice"], "requested_version": 9,
         "requested_at": at(500), "go_away_time_left_s": None, "disconnected_version": 15,
         "disconnected_at": at(1900), "disconnect_reason": "settings", "detail": "",
         "from_generation": 1, "connected_version": 16, "connected_at": at(2100),
         "generation": 2, "resumed_handle": "h-1", "waited_ms": 1400.0, "downtime_ms": 200.0},
        {"reason": "takeover", "keys": [], "requested_version": None, "requested_at": None,
         "go_away_time_left_s": None, "disconnected_version": None, "disconnected_at": None,
         "disconnect_reason": None, "detail": "", "from_generation": 2,
         "connected_version": 24, "connected_at": at(4300), "generation": 3,
         "resumed_handle": "h-2", "waited_ms": None, "downtime_ms": None}]
    assert tl["takeovers"] == [{"version": 23, "at": at(4000), "worker": "w2", "epoch": 2,
                                "reason": "takeover", "kind": "crash", "previous_worker": "w1",
                                "last_event_version": 22, "last_event_at": at(3200),
                                "last_event_type": "connection.handle_issued",
                                "silent_ms": 800.0}]
    assert (tl["call"], tl["head"], tl["summary"]["call"]) == ("support-1", 25, "support-1")
    assert tl["problems"] == []
    assert SECRET not in json.dumps(tl)
    window = out_json(await acli("timeline", "support-1", "--from", "10", "--limit", "3",
                                 "--json", backend=loaded))
    assert [e["version"] for e in window["entries"]] == [10, 11, 12]
    assert window["entries"][0]["offset_ms"] == 1500.0
    text = await acli("timeline", "support-1", "--redact", backend=loaded)
    assert text.exit_code == 0 and "bob@example.com" not in text.stdout
    assert "tool calls" in text.stdout and "reconnects" in text.stdout


async def test_a_window_from_before_the_first_version_starts_at_it(loaded):
    """`--from 0` or a negative one (a script computing "previous page") is the start of the
    call: a window of --limit events from version 1, timed from the call's start, as
    `--from 1` is (it was an empty window "versions 0–0" started in 1970)."""
    first = out_json(await acli("timeline", "support-1", "--from", "1", "--limit", "3",
                                "--json", backend=loaded))
    for start in ("0", "-5"):
        window = out_json(await acli("timeline", "support-1", "--from", start, "--limit", "3",
                                     "--json", backend=loaded))
        assert [e["version"] for e in window["entries"]] == [1, 2, 3], start
        assert window == first, start


async def test_state_json(loaded):
    mid = out_json(await acli("state", "support-1", "--at", "7", "--json", backend=loaded))
    assert {k: mid[k] for k in ("call", "version", "bot_speaking", "deferred", "to_send",
                                "unanswered", "generation", "connected", "newest_handle")} == {
        "call": "support-1", "version": 7, "bot_speaking": True, "deferred": ["c1"],
        "to_send": [], "unanswered": ["c1"], "generation": 1, "connected": True,
        "newest_handle": "h-1"}
    assert mid["tool_calls"][0]["status"] == "deferred"
    assert mid["event"]["type"] == "tool.call_deferred" and mid["event"]["version"] == 7
    assert mid["settings"] == {"voice": "Puck", "api_key": MASK}
    end = out_json(await acli("state", "support-1", "--json", backend=loaded))
    assert (end["version"], end["closed"], end["epoch"], end["takeovers"]) == (25, True, 2, 1)
    [c1] = end["tool_calls"]
    assert c1["in_current_session"] and c1["times_in_current_session"] == 1
    assert SECRET not in json.dumps(end)
    red = out_json(await acli("state", "support-1", "--json", "--redact", backend=loaded))
    assert "bob@example.com" not in json.dumps(red) and "Kore" not in json.dumps(red)
    table = await acli("state", "support-1", backend=loaded)
    assert table.exit_code == 0 and "lookup_order" in table.stdout


async def test_export_is_stable_json_lines(loaded):
    r = await acli("export", "support-1", backend=loaded)
    assert r.exit_code == 0
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == 25
    assert lines[1] == {"export_schema": 2, "call": "support-1", "version": 2,
                        "position": lines[1]["position"], "type": "connection.connected",
                        "schema_version": 1, "recorded_at": at(0), "recorded_at_us": T0,
                        "data": {"generation": 1, "handle": None,
                                 "system_instruction_sha256": None},
                        "hash": lines[1]["hash"], "redacted": []}
    assert [x["version"] for x in lines] == list(range(1, 26))
    # unredacted lines re-hash to the stored chain: an auditor can check an export offline
    prev = GENESIS_HASH
    for x in lines:
        if not x["redacted"]:
            assert chain_hash(prev, x["call"], x["version"], x["type"],
                              x["schema_version"], x["recorded_at_us"],
                              canonical_json(x["data"])) == x["hash"]
        prev = x["hash"]
    assert [x["redacted"] for x in lines if x["redacted"]] == [
        ["data.settings.api_key"], ["data.args.auth_token"], ["data.result.password"]]


async def test_verify_json_golden(loaded):
    assert out_json(await acli("verify", "--json", backend=loaded)) == {"ok": True, "calls": [
        {"call": s, "ok": True, "events_checked": n, "first_bad_version": None,
         "first_bad_position": None, "reason": ""}
        for s, n in (("failing-1", 8), ("live-1", 2), ("support-1", 25))]}
    one = await acli("verify", "support-1", backend=loaded)
    assert one.exit_code == 0 and "ok   support-1: 25 events" in one.stdout


async def test_replay_json_golden(loaded):
    assert out_json(await acli("replay", "support-1", "--json", backend=loaded)) == {
        "call": "support-1", "ok": True, "events": 25, "decisions_checked": 6,
        "effects_checked": 7, "error": None, "divergences": [],
        "coverage": {"decisions_logged": 0, "not_replayed": {}, "reconstructed": 6,
                     "text": "6 decisions of a log that predates decision.observed, "
                             "reconstructed from its events (sessions opened and left, "
                             "results, stopped calls and outcome checks are not)"}}
    other = await acli("replay", "support-1", "--defer", "none", "--json", backend=loaded)
    assert other.exit_code == 1
    [d] = json.loads(other.stdout)["divergences"]
    assert (d["version"], d["to_version"], d["kind"]) == (6, 7, "decide")
    assert d["logged"][0]["data"]["args"]["auth_token"] == MASK  # reports never leak either
    text = await acli("replay", "support-1", "--defer", "none", backend=loaded)
    assert text.exit_code == 1 and "v6–7 [decide]" in text.stdout


@pytest.mark.parametrize("command", [["timeline"], ["state"], ["export"], ["replay"],
                                     ["verify"], ["state", "--at", "3"]])
async def test_unknown_call_is_a_clean_not_found(migrated, command):
    r = await acli(command[0], "no-such-call", *command[1:], backend=migrated)
    assert r.exit_code == 2
    assert r.stderr.strip() == "error: call 'no-such-call' not found"
    assert r.stdout == ""


async def test_a_version_the_call_does_not_have_is_bad_input(loaded):
    """`timeline --from` past the last event printed an empty "versions 0–0" timeline, and
    `state --at` past it (or before the first) silently showed another version, both with
    exit code 0: a script paging through a call could not tell the end from an empty page.
    Now one `error:` line naming the call's range, exit code 2."""
    head = len(support_call())
    r = await acli("timeline", "support-1", "--from", str(head + 1), backend=loaded)
    assert r.exit_code == 2 and f"versions 1–{head}" in r.stderr, (r.exit_code, r.output)
    for version in (str(head + 1), "0", "-3"):
        r = await acli("state", "support-1", "--at", version, backend=loaded)
        assert r.exit_code == 2 and f"versions 1–{head}" in r.stderr, (version, r.exit_code, r.output)
    # The last version itself is still a window of one, and a state.
    last = out_json(await acli("timeline", "support-1", "--from", str(head), "--json",
                               backend=loaded))
    assert [e["version"] for e in last["entries"]] == [head]
    assert out_json(await acli("state", "support-1", "--at", str(head), "--json",
                               backend=loaded))["version"] == head


async def test_export_positions_are_the_stored_ones(loaded, store):
    """`position` is the event's global position in the log (what `tail` resumes from),
    not its version: failing-1 was written after support-1, so they differ."""
    r = await acli("export", "failing-1", backend=loaded)
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    stored = await store.read("failing-1")
    assert [(x["version"], x["position"], x["hash"]) for x in lines] == [
        (rec.version, rec.position, rec.hash) for rec in stored]
    assert lines[0]["position"] != lines[0]["version"]


async def test_state_at_a_version_says_what_runs_and_what_is_in_doubt(migrated):
    """`state --at` before and after a takeover: a call the first worker started is running
    under it, and in doubt once another worker has the call (its outcome is unknown)."""
    await write_call(migrated, "doubt-1", [
        (0, ev.SessionOpened("gemini-live", ["book"], "w1", 1)), (0, ev.Connected(1)),
        (100, ev.ToolCallRequested("c1", "book", {"room": 1}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "doubt-1:c1", 1)),
        (500, ev.WorkerAttached("w2", 2, "takeover"))])
    before = out_json(await acli("state", "doubt-1", "--at", "4", "--json", backend=migrated))
    assert (before["running"], before["in_doubt"], before["unanswered"]) == (["c1"], [], ["c1"])
    after = out_json(await acli("state", "doubt-1", "--at", "5", "--json", backend=migrated))
    assert (after["running"], after["in_doubt"], after["epoch"]) == ([], ["c1"], 2)


async def test_a_closed_call_says_what_became_of_its_tools_never_running(migrated):
    """Issue #32: a hang-up 100 ms into a tool. One tool finished after the end (its outcome
    is shown, and counted), one never did (in doubt, counted); `running` stays empty."""
    await write_call(migrated, "hangup-1", [
        (0, ev.SessionOpened("gemini-live", ["refund_order"], "w1", 1)), (0, ev.Connected(1)),
        (100, ev.ToolCallRequested("c1", "refund_order", {"order_id": 3}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "hangup-1:c1", 1)),
        (120, ev.ToolCallRequested("c2", "refund_order", {"order_id": 4}, 1)),
        (130, ev.ToolCallStarted("c2", 1, "hangup-1:c2", 1)),
        (210, ev.Disconnected(1, "shutdown")), (210, ev.SessionClosed("ended")),
        (600, ev.ToolCallCompleted("c1", {"refunded": True}))])
    state = out_json(await acli("state", "hangup-1", "--json", backend=migrated))
    assert (state["running"], state["in_doubt"], state["finished_after_end"]) == (
        [], ["c2"], ["c1"])
    c1 = next(c for c in state["tool_calls"] if c["tool_call_id"] == "c1")
    assert (c1["status"], c1["result"], c1["finished_after_end"]) == (
        "completed", {"refunded": True}, True)
    (row,) = out_json(await acli("calls", "--json", backend=migrated))["calls"]
    assert (row["finished_after_end"], row["in_doubt"]) == (1, 1)
    text = (await acli("state", "hangup-1", backend=migrated)).stdout
    assert "finished_after_end" in text and "running" in text
    table = (await acli("calls", backend=migrated)).stdout
    assert "doubt" in table


async def test_the_timeline_says_what_an_outcome_check_answered(migrated):
    await write_call(migrated, "checked-1", [
        (0, ev.SessionOpened("gemini-live", ["refund_order"], "w1", 1)), (0, ev.Connected(1)),
        (100, ev.ToolCallRequested("c1", "refund_order", {"order_id": 3}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "checked-1:c1", 1)),
        (500, ev.WorkerAttached("w2", 2, "takeover")),
        (520, ev.ToolOutcomeChecked("c1", "done")),
        (520, ev.ToolCallCompleted("c1", {"refunded": True}))])
    tl = out_json(await acli("timeline", "checked-1", "--json", backend=migrated))
    (entry,) = [e for e in tl["entries"] if e["version"] == 6]
    assert (entry["lane"], entry["summary"]) == (
        "tools", "c1: in doubt after a crash; its outcome check says it was done (the model "
                 "gets its result)")
    state = out_json(await acli("state", "checked-1", "--json", backend=migrated))
    assert [(c["checked"], c["status"]) for c in state["tool_calls"]] == [("done", "completed")]


async def test_calls_time_bounds_are_since_inclusive_until_exclusive(loaded):
    """`--since T` lists calls started at or after T, `--until T` those started before T:
    a call started exactly at T is on the --since side, once."""
    failing_start = at(0, T0 + HOUR_US)

    async def ids(*args):
        return [c["call"] for c in out_json(await acli("calls", "--json", *args,
                                                       backend=loaded))["calls"]]

    assert await ids("--since", failing_start) == ["live-1", "failing-1"]
    assert await ids("--until", failing_start) == ["support-1"]
    assert await ids("--since", failing_start, "--until", at(1, T0 + HOUR_US)) == ["failing-1"]


async def test_paging_through_calls_that_started_at_the_same_time(migrated):
    """Ties on the start time are ordered by call id (descending): paging with --after
    lists each call exactly once, and the last page says there is no next one."""
    for call in ("tie-a", "tie-b", "tie-c"):
        await write_call(migrated, call, support_call()[:2])
    seen, after = [], None
    for _ in range(5):
        data = out_json(await acli("calls", "--json", "--limit", "1",
                                   *(["--after", after] if after else []), backend=migrated))
        seen += [c["call"] for c in data["calls"]]
        after = data["next_after"]
        if after is None:
            break
    assert seen == ["tie-c", "tie-b", "tie-a"]
    full = out_json(await acli("calls", "--json", "--limit", "3", backend=migrated))
    assert [c["call"] for c in full["calls"]] == seen and full["next_after"] is None
    table = await acli("calls", "--limit", "2", backend=migrated)
    assert table.exit_code == 0 and "more: --after tie-b" in table.stdout, table.stdout


async def test_calls_count_cancellations(migrated):
    await write_call(migrated, "cancel-1", [
        (0, ev.SessionOpened("gemini-live", ["book"], "w1", 1)), (0, ev.Connected(1)),
        (100, ev.ToolCallRequested("c1", "book", {}, 1)),
        (200, ev.ToolCallCancelled("c1", "server"))])
    [row] = out_json(await acli("calls", "--json", backend=migrated))["calls"]
    assert (row["tool_calls"], row["cancelled"], row["failures"]) == (1, 1, 0)


async def test_calls_search_is_case_sensitive_on_both_databases(loaded):
    """`--search` matches the id as written: SQLite's LIKE ignores ASCII case, PostgreSQL's
    does not; both list the same calls."""
    for text, expected in (("support", ["support-1"]), ("SUPPORT", []), ("Ail", []),
                           ("ail", ["failing-1"])):
        data = out_json(await acli("calls", "--json", "--search", text, backend=loaded))
        assert [c["call"] for c in data["calls"]] == expected, text
