"""`session-store`: migrate, inspect, verify and export call logs; run the demo.

Every command takes --db URL (default $SESSION_STORE_URL, else sqlite+aiosqlite:///sessions.db).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import SessionStoreError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Durable Gemini Live sessions: the call log and its tools.")
console = Console()
DEFAULT_URL = "sqlite+aiosqlite:///sessions.db"

DbOption = typer.Option(None, "--db", envvar="SESSION_STORE_URL",
                        help="Database URL (default sqlite+aiosqlite:///sessions.db).")
SchemaOption = typer.Option(None, "--schema", help="PostgreSQL schema (search path).")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _run(coro_fn: Callable[..., Awaitable[Any]], *args) -> Any:
    try:
        return asyncio.run(coro_fn(*args))
    except SessionStoreError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


async def _open(db: str | None, schema: str | None):
    from .storage import open_store

    return await open_store(db or DEFAULT_URL, **({"schema": schema} if schema else {}))


@app.command()
def migrate(db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption) -> None:
    """Create or upgrade the schema (alembic upgrade head)."""
    from .migrate import upgrade

    _run(lambda: upgrade(db or DEFAULT_URL, schema=schema))
    console.print("schema is at head")


@app.command()
def verify(call: Optional[str] = typer.Argument(None, help="Call id (all calls if omitted)."),
           db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
           as_json: bool = JsonOption) -> None:
    """Recompute hash chains; exit 1 and name the first bad event if anything was altered."""

    async def go():
        store = await _open(db, schema)
        try:
            return await store.verify(call)
        finally:
            await store.close()

    reports = _run(go)
    bad = [r for r in reports if not r.ok]
    if as_json:
        print(json.dumps({"ok": not bad, "streams": [r.to_json() for r in reports]}, indent=2))
    else:
        for r in reports:
            if r.ok:
                console.print(f"[green]ok[/green]   {r.stream_id}: {r.events_checked} events")
            else:
                console.print(f"[red]BAD[/red]  {r.stream_id}: first bad event version "
                              f"{r.first_bad_version} (position {r.first_bad_position}): {r.reason}")
    if bad:
        raise typer.Exit(1)


@app.command()
def state(call: str, at: Optional[int] = typer.Option(None, "--at", help="Fold up to this version."),
          db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
          as_json: bool = JsonOption) -> None:
    """The projection of a call at any version: deferred, running, in doubt, undelivered."""
    from .loading import load_state

    async def go():
        store = await _open(db, schema)
        try:
            return await load_state(store, call, to_version=at)
        finally:
            await store.close()

    s = _run(go)
    summary = {
        "call": call, "version": s.version, "epoch": s.epoch, "generation": s.generation,
        "connected": s.connected, "bot_speaking": s.bot_speaking,
        "reconnect_pending": s.reconnect_pending, "newest_handle": s.newest_handle,
        "deferred": [c.call_id for c in s.pending()],
        "running": [c.call_id for c in s.running()],
        "in_doubt": [c.call_id for c in s.in_doubt()],
        "undelivered": [c.call_id for c in s.undelivered()],
        "calls": {c.call_id: {"name": c.name, "status": c.status,
                              "delivered": s.in_model(c)} for c in s.calls.values()},
    }
    if as_json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return
    for key, value in summary.items():
        if key != "calls":
            console.print(f"[bold]{key:18}[/bold] {value}")
    table = Table("call", "tool", "status", "delivered")
    for cid, c in summary["calls"].items():
        table.add_row(cid, c["name"], c["status"], str(c["delivered"]))
    console.print(table)


@app.command()
def export(call: str, db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption) -> None:
    """Every event of a call as JSON Lines (one event a line)."""

    async def go():
        store = await _open(db, schema)
        try:
            return await store.read(call)
        finally:
            await store.close()

    for rec in _run(go):
        sys.stdout.write(json.dumps(rec.to_json(), sort_keys=True) + "\n")


@app.command()
def tail(call: Optional[str] = typer.Argument(None), db: Optional[str] = DbOption,
         schema: Optional[str] = SchemaOption) -> None:
    """Follow new events live (Ctrl-C to stop)."""

    async def go():
        store = await _open(db, schema)
        try:
            async for rec in store.subscribe(0, stream_id=call):
                console.print(f"{rec.recorded_at:%H:%M:%S.%f} {rec.stream_id}@{rec.version} "
                              f"{rec.type} {rec.data_json}", markup=False, highlight=False)
        finally:
            await store.close()

    try:
        _run(go)
    except KeyboardInterrupt:
        pass


@app.command()
def demo(db: str = typer.Option("sqlite+aiosqlite:///sessions.db", "--db"),
         as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON.")) -> None:
    """Run the demo call offline (no API key, no network) and print its timeline and verdict."""
    from service.demo import run_demo  # the demo drives the pipecat service

    verdict = _run(run_demo, db, as_json)
    if as_json:
        print(json.dumps(verdict, indent=2))
    if not verdict["ok"]:
        raise typer.Exit(1)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()
