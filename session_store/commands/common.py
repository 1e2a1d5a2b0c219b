"""What every `session-store` command shares: its options, its output path, the store.

Human output goes through `say` (one line, control characters escaped, never wrapped) and
`show` (a table or view, never with an id cut); errors through `fail` (exit 2). Every
command but `migrate` and `demo` opens the store read-only (`with_store`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn

import typer

from ..errors import SessionStoreError

DEFAULT_URL = "sqlite+aiosqlite:///sessions.db"
DB_ENVVAR = "SESSION_STORE_URL"

DbOption = typer.Option(None, "--db", envvar=DB_ENVVAR,
                        help="A SQLite file's path, or a database URL: sqlite:///path.db, "
                        "postgresql://user@host/db (default sessions.db).")
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


def scrub(text: str) -> str:
    """Credential-looking text masked: an error or a verify report may quote a stored value
    (a field of the wrong type is named with the start of its value)."""
    from ..audit.redaction import Redactor

    return Redactor().scrub_text(text)


def _out(stderr: bool = False):
    from ..audit.text import output_console

    return output_console(stderr=stderr)


def say(text: str, stderr: bool = False, style: str | None = None) -> None:
    """One line of stored-data-bearing text: control characters escaped, never wrapped."""
    from ..audit.fmt import printable

    _out(stderr).print(printable(text), markup=False, highlight=False, soft_wrap=True,
                       style=style)


def show(renderable) -> None:
    """A table or a view, never with an id cut (`audit.text.print_whole`)."""
    from ..audit.text import print_whole

    print_whole(_out(), renderable)


def fail(message: str, code: int = 2) -> NoReturn:
    # soft_wrap: one line however long (a script greps it; rich would wrap at 80 columns)
    say(f"error: {scrub(message)}", stderr=True)
    raise typer.Exit(code)


def run(coro_fn: Callable[..., Coroutine[Any, Any, Any]], *args) -> Any:
    from sqlalchemy.exc import DBAPIError

    from ..errors import driver_said

    try:
        return asyncio.run(coro_fn(*args))
    except (SessionStoreError, UserError) as exc:
        fail(str(exc))
    except DBAPIError as exc:  # reached, and cannot read it (SQLite: a malformed file)
        fail(f"the database cannot be read ({driver_said(exc)}); "
             "`session-store verify` says which calls it spoils")


def url_of(db: str | None) -> str:
    from ..storage.db_url import resolve_db

    # An empty --db, or $SESSION_STORE_URL set to nothing, is a mistake: reading sessions.db
    # instead would show another database's calls as if they were these. (Click takes an
    # empty variable for an unset one: it is looked at here.)
    from_env = os.environ.get(DB_ENVVAR)
    if db is None and from_env is not None and not from_env.strip():
        db = from_env
    if db is not None and not db.strip():
        given = f"${DB_ENVVAR}" if db == from_env else "--db"
        raise UserError(f"{given} is empty: give a SQLite file's path or a database URL "
                        f"(unset ${DB_ENVVAR} for the default sessions.db)")
    try:
        return resolve_db(db or DEFAULT_URL)
    except ValueError as exc:
        raise UserError(str(exc)) from None


async def _open(db: str | None, schema: str | None):
    """The store, read-only: no tool but `migrate` writes (nor starts SQLite's writer)."""
    from ..storage import open_store

    try:
        return await open_store(url_of(db), read_only=True,
                                **({"schema": schema} if schema else {}))
    except ValueError as exc:  # a bad --db or --schema: one line, not a traceback
        raise UserError(str(exc)) from None


class _Result:
    """What a command's coroutine returns, out of the event loop behind a short repr:
    asyncio's runner formats its main task's result with repr(), whole (for a 100 MB call's
    state, 200 MB more and a second of CPU for nothing)."""

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return "<result>"


def with_store(db: str | None, schema: str | None, fn: Callable[[Any], Awaitable[Any]]) -> Any:
    async def go():
        store = await _open(db, schema)
        try:
            return _Result(await fn(store))
        finally:
            await store.close()

    result = run(go)
    return result.value if isinstance(result, _Result) else result


def redactor_for(redact: bool, keys: str | None, config: str | None):
    from ..audit import Redactor, load_config

    try:
        return Redactor(load_config(redact=redact, keys=keys, path=config))
    except (OSError, ValueError) as exc:
        fail(f"redaction config: {exc}")


def print_json(obj: Any) -> None:
    from ..audit.jsontext import write_json

    write_json(sys.stdout.write, obj, indent=2)
    sys.stdout.write("\n")


def json_line(obj: Any) -> str:
    from ..audit.jsontext import dumps

    return dumps(obj, sort_keys=True) + "\n"


def now_us() -> int:
    return time.time_ns() // 1000


async def require_call(store, call: str) -> int:
    """The call's head version; "not found", or the damage that keeps it from being read
    whole (events missing, a head row deleted: never shown as a shorter call)."""
    from ..audit.queries import complete_head

    version = await complete_head(store, call)
    if version == 0:
        raise UserError(f"call {call!r} not found")
    return version
