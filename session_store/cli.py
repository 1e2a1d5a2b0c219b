"""`session-store`: migrate, list and inspect calls, verify, export, replay, serve the viewer.

Every command takes --db URL (default $SESSION_STORE_URL, else sqlite+aiosqlite:///sessions.db)
and --schema (a PostgreSQL schema); every listing takes --json. The logic lives in
`session_store.audit`; this module parses options and prints. Exit codes: 0 fine, 1 the check
failed (verify found tampering, replay found divergences), 2 error (bad input, unknown call,
unreachable database).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Optional

import typer
from rich.console import Console

from .errors import SessionStoreError, StoreUnavailable

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Durable Gemini Live sessions: the call log and its tools.")
console = Console()
err_console = Console(stderr=True)
DEFAULT_URL = "sqlite+aiosqlite:///sessions.db"
# `tail` asks again after an outage: first after this long, doubling up to the max.
TAIL_RETRY_FIRST_S, TAIL_RETRY_MAX_S = 0.5, 5.0

DbOption = typer.Option(None, "--db", envvar="SESSION_STORE_URL",
                        help="Database URL (default sqlite+aiosqlite:///sessions.db).")
SchemaOption = typer.Option(None, "--schema", help="PostgreSQL schema (search path).")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")
RedactOption = typer.Option(False, "--redact", help="Mask transcripts, settings values, handles "
                            "and the configured argument/result keys (secrets are always masked).")
RedactKeysOption = typer.Option(None, "--redact-keys", help="Comma-separated argument/result "
                                "keys to mask (implies --redact; also $SESSION_STORE_REDACT_KEYS).")
RedactConfigOption = typer.Option(None, "--redact-config", help="Redaction config file, JSON or "
                                  "TOML (also $SESSION_STORE_REDACT_CONFIG).")


class UserError(Exception):
    """Bad input or an unknown call: printed as one line, exit code 2."""


def _scrub(text: str) -> str:
    """Credential-looking text masked: an error or a verify report may quote a stored value
    (a field of the wrong type is named with the start of its value)."""
    from .audit.redaction import Redactor

    return Redactor().scrub_text(text)


def _fail(message: str, code: int = 2):
    # soft_wrap: one line however long (a script greps it; rich would wrap at 80 columns)
    err_console.print(f"error: {_scrub(message)}", markup=False, highlight=False,
                      soft_wrap=True)
    raise typer.Exit(code)


def _run(coro_fn: Callable[..., Awaitable[Any]], *args) -> Any:
    try:
        return asyncio.run(coro_fn(*args))
    except (SessionStoreError, UserError) as exc:
        _fail(str(exc))


async def _open(db: str | None, schema: str | None):
    from .storage import open_store

    try:
        return await open_store(db or DEFAULT_URL, **({"schema": schema} if schema else {}))
    except ValueError as exc:  # a bad --db or --schema: one line, not a traceback
        raise UserError(str(exc)) from None


def _with_store(db: str | None, schema: str | None, fn: Callable[[Any], Awaitable[Any]]) -> Any:
    async def go():
        store = await _open(db, schema)
        try:
            return await fn(store)
        finally:
            await store.close()

    return _run(go)


def _redactor(redact: bool, keys: str | None, config: str | None):
    from .audit import Redactor, load_config

    try:
        return Redactor(load_config(redact=redact, keys=keys, path=config))
    except (OSError, ValueError) as exc:
        _fail(f"redaction config: {exc}")


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def _now_us() -> int:
    return time.time_ns() // 1000


async def _require_call(store, call: str) -> int:
    """The call's head version; "not found", or the damage that keeps it from being read
    whole (events missing, a head row deleted: never shown as a shorter call)."""
    from .audit.queries import complete_head

    version = await complete_head(store, call)
    if version == 0:
        raise UserError(f"call {call!r} not found")
    return version


@app.command()
def migrate(db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption) -> None:
    """Create or upgrade the schema (alembic upgrade head)."""
    from .migrate import upgrade

    async def go():
        try:
            await upgrade(db or DEFAULT_URL, schema=schema)
        except ValueError as exc:  # a bad --schema: one line, not a traceback
            raise UserError(str(exc)) from None

    _run(go)
    console.print("schema is at head")


@app.command()
def calls(since: Optional[str] = typer.Option(None, "--since", help="Started at or after "
                                              "(ISO 8601, or an age like 2h)."),
          until: Optional[str] = typer.Option(None, "--until", help="Started before."),
          status: Optional[str] = typer.Option(None, "--status", help="open | closed | stale"),
          search: Optional[str] = typer.Option(None, "--search", help="Call id contains."),
          limit: int = typer.Option(50, "--limit", help="Calls per page (newest first)."),
          after: Optional[str] = typer.Option(None, "--after", help="Continue after this call "
                                              "(the last one of the previous page)."),
          db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
          as_json: bool = JsonOption) -> None:
    """List calls: start, duration, status, counts of tool calls, reconnects, takeovers."""
    from .audit import CallFilter, parse_time
    from .audit.queries import list_calls
    from .audit.text import calls_table

    try:
        flt = CallFilter(parse_time(since), parse_time(until), status, search, after, limit)
    except ValueError as exc:
        _fail(str(exc))
    try:
        page = _with_store(db, schema, lambda store: list_calls(store, flt, _now_us()))
    except ValueError as exc:  # --after names no call
        _fail(str(exc))
    if as_json:
        _print_json(page.to_json())
    else:
        console.print(calls_table(page.calls, page.next_after))


@app.command()
def timeline(call: str,
             from_version: int = typer.Option(1, "--from", help="First version to show."),
             limit: Optional[int] = typer.Option(None, "--limit", help="At most this many "
                                                 "events (default: all)."),
             redact: bool = RedactOption, redact_keys: Optional[str] = RedactKeysOption,
             redact_config: Optional[str] = RedactConfigOption,
             db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
             as_json: bool = JsonOption) -> None:
    """One ordered view of a call: speech, tool calls (wait, run, delivery), reconnects…"""
    from .audit import build_timeline
    from .audit.text import timeline_view
    from .projection import fold

    redactor = _redactor(redact, redact_keys, redact_config)

    start = max(from_version, 1)  # versions start at 1: --from 0 or less is the start

    async def go(store):
        head = await _require_call(store, call)
        if start > head:  # (an empty page would look like a call with nothing in it)
            raise UserError(f"call {call} has versions 1–{head}: --from {from_version} "
                            "is past its end")
        to = head if limit is None else min(head, start + max(limit, 1) - 1)
        recs = await store.read(call, from_version=start, to_version=to)
        first = recs[:1] if start == 1 else await store.read(call, to_version=1)
        final = fold(recs) if start == 1 and to == head else None
        return build_timeline(redactor.redact_records(recs), call_id=call,
                              t0_us=first[0].recorded_at_us if first else None,
                              final_state=final)

    tl = _with_store(db, schema, go)
    if as_json:
        _print_json(tl.to_json())
    else:
        console.print(timeline_view(tl))


@app.command()
def state(call: str, at: Optional[int] = typer.Option(None, "--at", help="Fold up to this version."),
          redact: bool = RedactOption, redact_keys: Optional[str] = RedactKeysOption,
          redact_config: Optional[str] = RedactConfigOption,
          db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
          as_json: bool = JsonOption) -> None:
    """The projection of a call at any version: deferred, running, in doubt, undelivered."""
    from .audit import state_view
    from .audit.queries import state_at
    from .audit.text import state_view_text

    redactor = _redactor(redact, redact_keys, redact_config)

    async def go(store):
        head = await _require_call(store, call)
        if at is not None and not 1 <= at <= head:  # (never another version than asked)
            raise UserError(f"call {call} has versions 1–{head}: --at {at} is not one of them")
        return await state_at(store, call, at)

    view = redactor.redact_state(state_view(_with_store(db, schema, go), call))
    if as_json:
        _print_json(view)
    else:
        console.print(state_view_text(view))


@app.command()
def export(call: str, redact: bool = RedactOption,
           redact_keys: Optional[str] = RedactKeysOption,
           redact_config: Optional[str] = RedactConfigOption,
           db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption) -> None:
    """Every event of a call as JSON Lines (one event a line; secrets always masked)."""
    from .audit import export_line
    from .audit.queries import iter_records
    from .errors import StreamDamaged

    redactor = _redactor(redact, redact_keys, redact_config)

    async def go(store):
        try:
            head, damage = await _require_call(store, call), None
        except StreamDamaged as exc:  # export what is stored all the same, then say so
            head, damage = None, exc
        async for chunk in iter_records(store, call, to_version=head):
            sys.stdout.write("".join(json.dumps(export_line(r, redactor), sort_keys=True,
                                                ensure_ascii=False) + "\n" for r in chunk))
        if damage is not None:
            sys.stdout.flush()
            raise damage  # exit 2: nobody takes what went out for the whole call

    _with_store(db, schema, go)


@app.command()
def verify(call: Optional[str] = typer.Argument(None, help="Call id (all calls if omitted)."),
           db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
           as_json: bool = JsonOption) -> None:
    """Recompute hash chains; exit 1 and name the first bad event if anything was altered."""
    from .schema import valid_id

    async def go(store):
        if call is not None and not valid_id(call):
            raise UserError(f"call {call!r} not found")
        reports = await store.verify(call)
        if call is not None and all(r.ok and r.events_checked == 0 for r in reports):
            raise UserError(f"call {call!r} not found")
        return reports

    reports = _with_store(db, schema, go)
    bad = [r for r in reports if not r.ok]
    if as_json:
        _print_json({"ok": not bad, "streams": [{**r.to_json(), "reason": _scrub(r.reason)}
                                                for r in reports]})
    else:
        for r in reports:
            if r.ok:
                console.print(f"ok   {r.stream_id}: {r.events_checked} events", markup=False,
                              highlight=False)
            else:
                console.print(f"BAD  {r.stream_id}: first bad event version "
                              f"{r.first_bad_version} (position {r.first_bad_position}): "
                              f"{_scrub(r.reason)}", markup=False, highlight=False, style="red")
    if bad:
        raise typer.Exit(1)


@app.command()
def replay(call: str,
           defer: str = typer.Option("all", "--defer", help="Tools deferred while the bot "
                                     "speaks: all | none | name,name"),
           idempotent: str = typer.Option("", "--idempotent", help="Idempotent tools "
                                          "(re-run when in doubt): name,name"),
           reuse: str = typer.Option("all", "--reuse", help="Tools whose re-issued equivalent "
                                     "call is answered from the record: all | none | name,name"),
           go_away_margin: Optional[float] = typer.Option(None, "--go-away-margin",
                                                          help="Seconds before a goAway "
                                                          "deadline to reconnect anyway."),
           redact: bool = RedactOption, redact_keys: Optional[str] = RedactKeysOption,
           redact_config: Optional[str] = RedactConfigOption,
           db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
           as_json: bool = JsonOption) -> None:
    """Feed the log through today's decide/due and report every decision that differs."""
    from .audit import parse_policy
    from .audit import replay as run_replay
    from .audit.text import replay_text

    try:
        policy = parse_policy(defer, idempotent, reuse, go_away_margin)
    except ValueError as exc:  # a margin < 0
        _fail(str(exc))
    redactor = _redactor(redact, redact_keys, redact_config)

    async def go(store):
        head = await _require_call(store, call)
        return run_replay(await store.read(call, to_version=head), policy, call_id=call)

    # Divergences carry tool arguments and results: redacted as every output is (secrets
    # always; the rest as --redact or a config that forces it says).
    report = _with_store(db, schema, go).redacted(redactor)
    if as_json:
        _print_json(report.to_json())
    else:
        console.print(replay_text(report))
    if report.error:
        raise typer.Exit(2)
    if report.divergences:
        raise typer.Exit(1)


@app.command()
def tail(call: Optional[str] = typer.Argument(None), redact: bool = RedactOption,
         redact_keys: Optional[str] = RedactKeysOption,
         redact_config: Optional[str] = RedactConfigOption,
         db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
         as_json: bool = typer.Option(False, "--json", help="One export-format JSON line "
                                      "per event.")) -> None:
    """Follow new events live (Ctrl-C to stop)."""
    from .audit import export_line

    redactor = _redactor(redact, redact_keys, redact_config)

    def show(rec) -> None:
        if as_json:
            sys.stdout.write(json.dumps(export_line(rec, redactor), sort_keys=True,
                                        ensure_ascii=False) + "\n")
            sys.stdout.flush()
            return
        rec = redactor.redact_record(rec)
        # The date and the zone too: a tail runs past midnight, next to logs of other zones.
        console.print(f"{rec.recorded_at:%Y-%m-%dT%H:%M:%S.%f}Z {rec.stream_id}@{rec.version} "
                      f"{rec.type} {rec.data_json}", markup=False, highlight=False)

    async def go(store):
        # A follow outlives database outages: it says so on stderr and goes on from the last
        # event it showed once the database answers again (nothing skipped, nothing twice).
        position, delay = 0, TAIL_RETRY_FIRST_S
        while True:
            try:
                async for rec in store.subscribe(position, stream_id=call):
                    position = rec.position
                    show(rec)
                return
            except StoreUnavailable as exc:
                err_console.print(f"warning: {exc}; following again when it answers",
                                  markup=False, highlight=False)
            while True:
                await asyncio.sleep(delay)
                delay = min(delay * 2, TAIL_RETRY_MAX_S)
                try:
                    await store.list_streams(limit=1)
                except StoreUnavailable:
                    continue
                err_console.print("the database answers again: following", markup=False,
                                  highlight=False)
                delay = TAIL_RETRY_FIRST_S
                break

    try:
        _with_store(db, schema, go)
    except KeyboardInterrupt:
        pass


@app.command()
def serve(host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but "
                                   "loopback needs --token."),
          port: int = typer.Option(8765, "--port", min=0, max=65535,
                                   help="Port to bind; 0 picks a free one."),
          token: Optional[str] = typer.Option(None, "--token", envvar="SESSION_STORE_WEB_TOKEN",
                                              help="Require this token on every request."),
          redact: bool = RedactOption, redact_keys: Optional[str] = RedactKeysOption,
          redact_config: Optional[str] = RedactConfigOption,
          db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption) -> None:
    """Serve the read-only web viewer (call list, timelines, state inspector, export)."""
    from .web.app import check_bind, create_app

    try:
        check_bind(host, token)
    except ValueError as exc:
        _fail(str(exc))
    redactor = _redactor(redact, redact_keys, redact_config)
    # The app opens the store in its lifespan, where a failure is uvicorn's traceback: a
    # store that cannot be opened (bad URL, no schema, down) is told here, in one line.
    _with_store(db, schema, lambda store: asyncio.sleep(0))
    import uvicorn

    web = create_app(db or DEFAULT_URL, schema=schema, token=token, redaction=redactor.config)
    console.print(f"session-store viewer on http://{host}:{port}/"
                  + (" (token required)" if token else ""), markup=False, highlight=False)
    uvicorn.run(web, host=host, port=port, log_level="warning")


@app.command()
def demo(db: str = typer.Option("sqlite+aiosqlite:///sessions.db", "--db"),
         as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
         live: bool = typer.Option(False, "--live", help="Run against the real Gemini Live "
                                   "API (needs GOOGLE_API_KEY in the environment)."),
         model: Optional[str] = typer.Option(None, "--model", help="Live: the Gemini Live "
                                             "model (default: the demo's model)."),
         base_url: Optional[str] = typer.Option(None, "--base-url", hidden=True,
                                                help="Live: another endpoint speaking the API."),
         ca_cert: Optional[str] = typer.Option(None, "--ca-cert", hidden=True,
                                               help="Live: CA certificate for --base-url.")
         ) -> None:
    """Run the demo call (offline by default: no API key, no network); print its timeline
    and verdict."""
    from service.crash.harness import LiveTarget  # the demo drives the pipecat service
    from service.demo import LiveDemoUnavailable, run_demo

    target = LiveTarget(base_url, ca_cert, model) if live else None
    try:
        verdict = _run(run_demo, db, as_json, target)
    except LiveDemoUnavailable as exc:
        _fail(str(exc))
    if as_json:
        _print_json(verdict)
    if not verdict["ok"]:
        raise typer.Exit(1)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":
    main()
