"""Helpers of the support-tooling tests: deterministic call logs, bulk loading, the CLI.

Calls are written straight into the tables (valid hash chains and head rows, exactly as the
store writes them) so that every recorded time is chosen by the test: golden outputs can then
be compared exactly, times included. One test per backend also runs the real store path
(the demo) to make sure the tools read what the store writes.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from collections.abc import Sequence
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from session_store import events as ev
from session_store.audit.fmt import iso
from session_store.commands.cli import app
from session_store.events import Event, canonical_json
from session_store.records import GENESIS_HASH, RecordedEvent, chain_hash

T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
MS = 1000
HOUR_US = 3600 * 1_000_000


def at(offset_ms: float, t0: int = T0) -> str:
    """The ISO time the tools print for an event written at t0 + offset_ms."""
    return iso(t0 + int(offset_ms * MS))


def chain(stream_id: str, timed: Sequence[tuple[float, Event]], t0: int = T0,
          start_version: int = 1, prev_hash: str = GENESIS_HASH) -> list[RecordedEvent]:
    out, h = [], prev_hash
    for i, (offset_ms, e) in enumerate(timed):
        version = start_version + i
        data_json = canonical_json(e.to_data())
        at_us = t0 + int(offset_ms * MS)
        h = chain_hash(h, stream_id, version, e.TYPE, e.SCHEMA, at_us, data_json)
        out.append(RecordedEvent(stream_id, version, version, e.TYPE, e.SCHEMA, data_json,
                                 at_us, h))
    return out


def _pg_dsn(backend) -> tuple[str, dict]:
    url = make_url(backend.url)
    kwargs = dict(host=url.host, port=url.port, user=url.username, password=url.password,
                  database=url.database,
                  server_settings={"search_path": backend.options["schema"]})
    return "", kwargs


_EVENT_COLS = ["tx_order", "stream_id", "version", "type", "schema_version", "data",
               "recorded_at_us", "hash"]
_HEAD_COLS = ["stream_id", "version", "last_hash", "epoch", "created_at_us", "updated_at_us"]


async def write_records(backend, calls: dict[str, list[RecordedEvent]],
                        epochs: dict[str, int] | None = None) -> None:
    """Insert whole calls (new streams) with their head rows, in bulk. A head's epoch: as
    `epochs` says, else the highest its events record, as the store's appends leave it (a
    lower one is a fenced worker re-admitted: `verify` says so)."""
    epochs = epochs or {}
    rows, heads = [], []
    for sid, recs in calls.items():
        rows += [(0, r.stream_id, r.version, r.type, r.schema_version, r.data_json,
                  r.recorded_at_us, r.hash) for r in recs]
        epoch = epochs.get(sid) or _recorded_epoch(recs)
        heads.append((sid, recs[-1].version, recs[-1].hash, epoch,
                       recs[0].recorded_at_us, recs[-1].recorded_at_us))
    await write_rows(backend, rows, heads)


def _recorded_epoch(recs: list[RecordedEvent]) -> int:
    epochs = [1]
    for r in recs:
        if r.type in ("session.opened", "session.worker_attached"):
            try:
                epochs.append(int(json.loads(r.data_json).get("epoch", 1)))
            except (ValueError, TypeError, AttributeError):
                pass  # (a hostile row: its reader says so)
    return max(epochs)


async def write_rows(backend, rows: list[tuple], heads: list[tuple]) -> None:
    """Insert event rows (tx_order, stream_id, version, type, schema_version, data,
    recorded_at_us, hash) and head rows (stream_id, version, last_hash, epoch, created_at_us,
    updated_at_us): executemany on SQLite, COPY on PostgreSQL."""
    if backend.name == "sqlite":
        path = make_url(backend.url).database

        def go():
            conn = sqlite3.connect(path)
            try:
                with conn:
                    conn.executemany(f"INSERT INTO session_events ({', '.join(_EVENT_COLS)}) "
                                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                    conn.executemany(f"INSERT INTO session_streams ({', '.join(_HEAD_COLS)}) "
                                     "VALUES (?, ?, ?, ?, ?, ?)", heads)
            finally:
                conn.close()

        await asyncio.to_thread(go)
        return
    _, kwargs = _pg_dsn(backend)
    conn = await asyncpg.connect(**kwargs)
    try:
        async with conn.transaction():
            await conn.copy_records_to_table("session_events", records=rows, columns=_EVENT_COLS)
            await conn.copy_records_to_table("session_streams", records=heads,
                                             columns=_HEAD_COLS)
    finally:
        await conn.close()


async def write_call(backend, call_id: str, timed: Sequence[tuple[float, Event]],
                     t0: int = T0, epoch: int | None = None) -> list[RecordedEvent]:
    recs = chain(call_id, timed, t0)
    await write_records(backend, {call_id: recs}, {call_id: epoch})
    return recs


# --------------------------------------------------------------------------- scenarios

SECRET = "sk-SECRET-0123456789abcdef"


def support_call() -> list[tuple[float, Event]]:
    """"The bot went silent after it looked up my order": a full, correct call.

    Deferred tool call while the bot speaks, a buffered settings reconnect (a new voice) that
    resumes from an older handle (so the result is re-sent as content), a worker takeover, a
    close.
    """
    return [
        (0, ev.SessionOpened("gemini-live", ["lookup_order", "send_email"], "w1", 1,
                             {"voice": "Puck", "api_key": SECRET})),
        (0, ev.Connected(1)),
        (100, ev.HandleIssued(1, "h-1", 0)),
        (200, ev.ConversationMessage("user", "Where is my order 42? I am bob@example.com", 1)),
        (300, ev.BotStartedSpeaking(1)),
        (400, ev.ToolCallRequested("c1", "lookup_order",
                                   {"order_id": 42, "email": "bob@example.com",
                                    "auth_token": "tok-SECRET-abcdef"}, 1)),
        (400, ev.ToolCallDeferred("c1")),
        (500, ev.SettingsChanged(["voice"], {"voice": "Kore"}, True)),
        (500, ev.ReconnectRequested("settings", ["voice"])),
        (1500, ev.BotStoppedSpeaking(1)),
        (1520, ev.ToolCallStarted("c1", 1, "support-1:c1", 1)),
        (1820, ev.ToolCallCompleted("c1", {"status": "shipped", "password": "hunter2"})),
        (1830, ev.ToolResultSending("c1", 1, "tool_response")),
        (1840, ev.ToolResultSent("c1", 1, "tool_response")),
        (1900, ev.Disconnected(1, "settings")),
        (2100, ev.Connected(2, "h-1")),
        (2200, ev.ToolResultSending("c1", 2, "content")),
        (2210, ev.ToolResultSent("c1", 2, "content")),
        (2300, ev.BotStartedSpeaking(2)),
        (3000, ev.BotStoppedSpeaking(2)),
        (3100, ev.ConversationMessage("assistant", "Your order 42 has shipped.", 2)),
        (3200, ev.HandleIssued(2, "h-2", 3)),
        (4000, ev.WorkerAttached("w2", 2, "takeover")),
        (4300, ev.Connected(3, "h-2")),
        (5000, ev.SessionClosed("ended")),
    ]


def ten_megabyte_call() -> list[tuple[float, Event]]:
    """A closed call whose transcript and tool argument are 10 MB each (rendering bounds)."""
    big = "x" * 10_000_000
    return [(0, ev.SessionOpened("gemini-live", ["lookup"], "w1", 1)), (0, ev.Connected(1)),
            (100, ev.ConversationMessage("user", big, 1)),
            (200, ev.ToolCallRequested("c1", "lookup", {"note": big}, 1)),
            (300, ev.SessionClosed("ended"))]


def failing_call() -> list[tuple[float, Event]]:
    """An open call: a tool fails, an anomaly is recorded; nobody spoke yet."""
    return [
        (0, ev.SessionOpened("gemini-live", ["lookup_order"], "w1", 1)),
        (0, ev.Connected(1)),
        (100, ev.ToolCallRequested("c1", "lookup_order", {"order_id": 7}, 1)),
        (120, ev.ToolCallStarted("c1", 1, "failing:c1", 1)),
        (900, ev.ToolCallFailed("c1", "timeout after 750 ms")),
        (910, ev.ToolResultSending("c1", 1, "tool_response")),
        (920, ev.ToolResultSent("c1", 1, "tool_response")),
        (1000, ev.AnomalyRecorded("duplicate_tool_call_id", {"call_id": "c1",
                                                            "name": "lookup_order"}, 1)),
    ]


# --------------------------------------------------------------------------- the CLI

_runner = CliRunner()


def cli(*args: str, backend=None) -> Any:
    """Run `session-store ARGS` in this process (call from a thread: it runs its own loop)."""
    full = list(args) + (backend.cli_args if backend is not None else [])
    return _runner.invoke(app, full, catch_exceptions=False)


async def acli(*args: str, backend=None):
    return await asyncio.to_thread(cli, *args, backend=backend)


def one_line_error(result, *said: str, unsaid: tuple[str, ...] = ()) -> None:
    """A CLI result that is one `error:` line, exit code 2 (no traceback), saying `said`."""
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"raw {type(result.exception).__name__}: {result.exception}"
    assert result.exit_code == 2 and result.output.startswith("error:"), result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1, result.output
    for part in said:
        assert part in result.output, result.output
    for part in unsaid:
        assert part not in result.output, result.output


def streamed_then_error(result, *said: str) -> None:
    """A streamed output (`export`) that stops at what it cannot read: what it wrote before
    are whole JSON lines on stdout, then one `error:` line on stderr saying `said`, exit 2."""
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    error = result.stderr.strip()
    assert error.startswith("error:") and "\n" not in error, result.output
    assert all(part in error for part in said), result.output
    for line in result.stdout.splitlines():
        json.loads(line)


ISO_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00")


def reissued_call() -> list[tuple[float, Event]]:
    """The connection drops while c1 runs; the fresh session asks again (c2): c2 is linked to
    c1 and gets its outcome when c1 finishes; the tool runs once."""
    return [
        (0, ev.SessionOpened("gemini-live", ["book_room"], "w1", 1)),
        (0, ev.Connected(1)),
        (100, ev.ToolCallRequested("c1", "book_room", {"room": 7}, 1)),
        (110, ev.ToolCallStarted("c1", 1, "reissue-1:c1", 1)),
        (200, ev.Disconnected(1, "error", "connection reset")),
        (300, ev.Connected(2)),
        (400, ev.ToolCallRequested("c2", "book_room", {"room": 7}, 2)),
        (400, ev.ToolCallReissued("c2", "c1")),
        (900, ev.ToolCallCompleted("c1", {"booked": True})),
        (910, ev.ToolResultSending("c2", 2, "tool_response")),
        (920, ev.ToolResultSent("c2", 2, "tool_response")),
    ]
