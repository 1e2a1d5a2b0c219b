"""`demo`: the offline demo call with a real crash (service.demo, loaded only when run)."""

from __future__ import annotations

from typing import Optional

import typer

from .common import UserError, fail, print_json, run, url_of


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
    from service.crash.case import LiveTarget  # the demo drives the pipecat service
    from service.demo import LiveDemoUnavailable, run_demo

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
