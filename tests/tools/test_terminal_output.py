"""Human output on a terminal of 80 and 200 columns and in a pipe, for every command: no id
cut, no line wrapped outside a terminal, JSON Lines one object a line, stored control
characters shown escaped (never executed), and rendering bounded by what it shows."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from session_store import events as ev

from .helpers import T0, acli, support_call, ten_megabyte_call, write_call
from .terminal import in_terminal, plain

LONG_ID = "prompt_change-" + "ba536c6" * 10 + "-c60"  # longer than a narrow terminal's column
ESC_ID = "esc-\x1b[2J-call"
NASTY = "hi \x1b[2J\x1b[1A\x1b]0;pwned\x07\r\u202eexe.txt there"


def hostile_call() -> list[tuple[float, ev.Event]]:
    """Escape sequences in a worker id, a transcript, tool arguments and results, an error;
    a tool call in doubt after a takeover (so `stats` names the call)."""
    return [
        (0, ev.SessionOpened("gemini-live", ["lookup"], "w\x1b[1A", 1)),
        (0, ev.Connected(1)),
        (100, ev.ConversationMessage("user", NASTY, 1)),
        (200, ev.ToolCallRequested("t\x1b[2J1", "lookup", {"note": NASTY}, 1)),
        (210, ev.ToolCallStarted("t\x1b[2J1", 1, "k", 1)),
        (900, ev.WorkerAttached("w2\x1b[2J", 2, "takeover")),
        (950, ev.ToolCallFailed("t\x1b[2J1", f"in doubt: {NASTY}", True)),
        (960, ev.ToolResultSending("t\x1b[2J1", 1, "tool_response")),
        (970, ev.ToolResultSent("t\x1b[2J1", 1, "tool_response")),
        (1000, ev.SessionClosed("ended \x1b[2J")),
    ]


# Rendering does not depend on the database: these run on SQLite only (the injection test
# above reads through both).
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


@pytest.fixture
async def desk(migrated):
    await write_call(migrated, LONG_ID, support_call())
    await write_call(migrated, ESC_ID, hostile_call(), T0 + 60_000_000)
    return migrated


def commands(call: str) -> list[list[str]]:
    """Every command with human output (each ends: the calls are closed)."""
    return [["calls"], ["timeline", call], ["timeline", call, "--from", "3", "--limit", "4"],
            ["state", call], ["state", call, "--at", "5"], ["verify"], ["verify", call],
            ["replay", call], ["tail", call, "-n", "30"], ["stats", "--since", "3000d"]]


def no_control(text: str, where) -> None:
    """Nothing but rich's own styles may reach the terminal: no escape from stored data."""
    rest = plain(text)
    assert "\x1b" not in rest and "\x07" not in rest and "\u202e" not in rest, (where, rest)
    assert "\r" not in rest, where


async def test_stored_escape_sequences_never_reach_the_terminal(desk, monkeypatch):
    """ANSI sequences in a call id, worker id, transcript, arguments, results and errors are
    shown as text (`\\x1b[2J`) by every command, piped or on a terminal."""
    for args in commands(ESC_ID):
        r = await acli(*args, backend=desk)
        assert r.exit_code in (0, 1), (args, r.output)
        no_control(r.stdout, args)
        code, text = await asyncio.to_thread(in_terminal, args + desk.cli_args, 80, monkeypatch)
        assert code in (0, 1), (args, text)
        no_control(text, ("terminal", args))
    shown = (await acli("timeline", ESC_ID, backend=desk)).stdout
    assert "\\x1b[2J" in shown and "\\u202e" in shown and "w\\x1b[1A" in shown
    assert r"esc-\x1b[2J-call" in (await acli("calls", backend=desk)).stdout
    assert r"esc-\x1b[2J-call" in (await acli("stats", "--since", "3000d",
                                              backend=desk)).stdout  # (in doubt)
    gone = await acli("timeline", "no\x1b[2Jcall", backend=desk)
    assert gone.exit_code == 2 and "\x1b" not in gone.stderr and "\\x1b[2J" in gone.stderr
    # JSON keeps the data as stored (JSON escapes it): a program reads what was logged.
    tl = json.loads((await acli("timeline", ESC_ID, "--json", backend=desk)).stdout)
    assert tl["call"] == ESC_ID and tl["entries"][2]["data"]["text"] == NASTY


@SQLITE_ONLY
async def test_tail_shows_stored_escapes_escaped(desk):
    r = await acli("tail", ESC_ID, "-n", "20", backend=desk)
    assert r.exit_code == 0
    no_control(r.stdout, "tail")
    assert len(r.stdout.splitlines()) == len(hostile_call())  # one line an event, then done


@SQLITE_ONLY
@pytest.mark.parametrize("columns", [80, 200])
async def test_on_a_terminal_no_id_is_cut(desk, monkeypatch, columns):
    """At 80 columns the call id (84 characters), tool call ids and `state --at`'s sends
    are whole; at 200 too."""
    for args in commands(LONG_ID):
        code, text = await asyncio.to_thread(in_terminal, args + desk.cli_args, columns,
                                             monkeypatch)
        assert code in (0, 1), (args, text)
        text = plain(text)
        if args[0] != "stats":
            assert LONG_ID in text, (columns, args, text)
        assert "…" not in text.replace("…\"", ""), (columns, args, text)
    code, text = await asyncio.to_thread(in_terminal, ["schema"], columns, monkeypatch)
    assert code == 0 and "call-page" in text and "export-line" in text
    _code, state = await asyncio.to_thread(in_terminal, ["state", LONG_ID, "--at", "13"]
                                           + desk.cli_args, columns, monkeypatch)
    assert "tool_response g1 v13 not confirmed" in re.sub(r"\s+", " ", plain(state))
    assert "False" not in state and "['" not in state  # words, not Python reprs


@SQLITE_ONLY
async def test_piped_output_is_never_wrapped(desk, monkeypatch):
    """Into a file or a pipe nothing is wrapped, whatever $COLUMNS says: each event is one
    line (grep finds it), each call one row, JSON Lines one object a line."""
    monkeypatch.setenv("COLUMNS", "80")
    tl = json.loads((await acli("timeline", LONG_ID, "--json", backend=desk)).stdout)
    text = (await acli("timeline", LONG_ID, backend=desk)).stdout
    lines = text.splitlines()
    for e in tl["entries"]:
        row = [x for x in lines if re.match(rf"^\s*{e['version']}\s+\d+\.\d{{3}}\s", x)]
        assert len(row) == 1 and e["summary"] in row[0], (e, row)
    assert any(len(x) > 120 for x in lines)  # wider than $COLUMNS: not wrapped
    assert f"call {LONG_ID}: versions 1–25" in text
    calls = (await acli("calls", backend=desk)).stdout.splitlines()
    assert len([x for x in calls if LONG_ID in x and "closed" in x]) == 1
    for args in (["export", LONG_ID], ["tail", LONG_ID, "-n", "25", "--json"]):
        out = (await acli(*args, backend=desk)).stdout.splitlines()
        assert len(out) == 25 and all(json.loads(x)["call"] == LONG_ID for x in out), args
    tail = (await acli("tail", LONG_ID, "-n", "25", backend=desk)).stdout.splitlines()
    assert len(tail) == 25 and all(f"{LONG_ID}@v" in x for x in tail)
    state = (await acli("state", LONG_ID, backend=desk)).stdout
    assert "tool_response g1 v13 sent; content g2 v17 sent" in state
    for args in commands(LONG_ID):
        out = (await acli(*args, backend=desk)).stdout
        assert not any(x != x.rstrip() for x in out.splitlines()), args  # no padding either


async def test_a_ten_megabyte_event_costs_what_its_line_shows(migrated):
    """A 10 MB transcript and a 10 MB argument: every human line stays short (values are cut
    before they are formatted); JSON and export keep them whole."""
    await write_call(migrated, "big-1", ten_megabyte_call())
    for args in (["tail", "big-1", "-n", "5"], ["timeline", "big-1"], ["state", "big-1"]):
        r = await acli(*args, backend=migrated)
        assert r.exit_code == 0, args
        assert len(r.stdout) < 20_000 and max(map(len, r.stdout.splitlines())) < 1000, args
    whole = await acli("export", "big-1", backend=migrated)
    assert len(whole.stdout) > 20_000_000
