"""`session-store`: migrate, list and inspect calls, verify, export, replay, tail, fleet
stats, serve the viewer.

Every command takes --db, a SQLite file's path or a URL (`session_store.db_url`; default
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

import os

import typer

from .commands import admin, checks, demo, fleet, serve, tail, views
from .commands.common import say as _say

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Durable Gemini Live sessions: the call log and its tools.")
# In this order in --help.
app.command()(admin.migrate)
app.command()(fleet.calls)
app.command()(views.timeline)
app.command()(views.state)
app.command()(views.export)
app.command()(checks.verify)
app.command()(checks.replay)
app.command()(tail.tail)
app.command()(fleet.stats)
app.command("schema")(admin.schema_cmd)
app.command()(serve.serve)
app.command()(demo.demo)


def _print_version(asked: bool) -> None:
    if asked:
        from . import __version__

        _say(f"session-store {__version__}")
        raise typer.Exit()


@app.callback()
def _options(show_version: bool = typer.Option(False, "--version", is_eager=True,
                                               callback=_print_version,
                                               help="Print the version and exit.")) -> None:
    """Durable Gemini Live sessions: the call log and its tools."""


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":
    main()
