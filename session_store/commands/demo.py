"""`demo`: the offline demo call with a real crash.

The call is run by the crash harness (`rig/`), which lives in the repository, not in the wheel:
the command finds it in a checkout (an editable install), and says how to get one otherwise.
"""

from __future__ import annotations

from typing import Optional

import typer

from .common import UserError, fail, print_json, run, url_of


NO_RIG = ("the demo runs the crash harness, which is not part of the installed package: "
          "clone the repository and run `make demo` in it (no API key, no network)")


def demo(db: str = typer.Option("sessions.db", "--db", help="Where the demo call is written "
                                 "(a SQLite file's path, or a database URL)."),
         as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
         live: bool = typer.Option(False, "--live", help="Run against the real Gemini Live "
                                   "API (needs GOOGLE_API_KEY in the environment)."),
         model: Optional[str] = typer.Option(None, "--model", help="The Gemini Live model "
                                             "the call names: offline, the local server "
                                             "applies its generation's wire rules (default: "
                                             "pipecat's default model)."),
         base_url: Optional[str] = typer.Option(None, "--base-url", hidden=True,
                                                help="Live: another endpoint speaking the API."),
         ca_cert: Optional[str] = typer.Option(None, "--ca-cert", hidden=True,
                                               help="Live: CA certificate for --base-url.")
         ) -> None:
    """Run the demo call (offline by default: no API key, no network); print its timeline
    and verdict."""
    try:
        from rig.crash.case import LiveTarget
        from rig.demo import LiveDemoUnavailable, run_demo
    except ModuleNotFoundError as exc:
        if exc.name not in ("rig", "rig.crash", "rig.demo"):
            raise
        fail(NO_RIG)

    target = LiveTarget(base_url, ca_cert, model) if live else None
    try:
        url = url_of(db)
    except UserError as exc:
        fail(str(exc))
    try:
        verdict = run(run_demo, url, as_json, target, model, db)
    except LiveDemoUnavailable as exc:
        fail(str(exc))
    if as_json:
        print_json(verdict)
    if not verdict["ok"]:
        raise typer.Exit(1)
