"""`session-store`: migrate, list and inspect calls, verify, export, replay, tail, fleet
stats, serve the viewer.

Every command takes --db, a SQLite file's path or a URL (`session_store.storage.db_url`; default
$SESSION_STORE_URL, else sessions.db) and --schema (a PostgreSQL schema); every listing takes
--json (one published schema per output: `session-store schema`). Only `migrate` (and `demo`)
write: the others open the store read-only. The logic lives in `session_store.audit`; the
commands (`session_store.commands`, one module per group) parse options and print; this
module lists them. Human output never cuts an id, wraps only on a terminal
(never in a pipe or a file) and shows stored control characters escaped. Exit codes: 0 fine,
1 the check
failed (verify found tampering, replay found divergences), 2 error (bad input, unknown call,
unreachable database).
"""

from __future__ import annotations

import inspect
import os

import typer
from typer.models import OptionInfo

from . import admin, checks, demo, fleet, serve, tail, views
from .common import say as _say

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Durable Gemini Live sessions: the call log and its tools.")


def _help(fn) -> str:
    """A command's docstring as help: each paragraph one line (typer's rich help keeps the
    source's line breaks, which cut a summary mid-sentence), paragraphs kept apart."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(fn.__doc__).split("\n\n"))


def _plain_flags(fn) -> None:
    """A flag is shown as `--json`, not `--json <bool>` (typer's help names its type, which
    reads as if it took a value)."""
    for param in inspect.signature(fn).parameters.values():
        option = param.default
        if isinstance(option, OptionInfo) and isinstance(option.default, bool):
            option.metavar = option.metavar or ""


def _command(fn, name: str | None = None) -> None:
    _plain_flags(fn)
    app.command(name, help=_help(fn))(fn)


# In this order in --help.
for _fn in (admin.migrate, fleet.calls, views.timeline, views.state, views.export,
            checks.verify, checks.replay, checks.reproduce, tail.tail, fleet.stats):
    _command(_fn)
_command(admin.schema_cmd, "schema")
_command(serve.serve)
_command(demo.demo)


def _print_version(asked: bool) -> None:
    if asked:
        from .. import __version__

        _say(f"session-store {__version__}")
        raise typer.Exit()


@app.callback(help="Durable Gemini Live sessions: the call log and its tools.")
def _options(show_version: bool = typer.Option(False, "--version", is_eager=True,
                                               callback=_print_version,
                                               help="Print the version and exit.")) -> None:
    """Durable Gemini Live sessions: the call log and its tools."""


_plain_flags(_options)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":
    main()
