"""`serve`: the read-only web viewer (session_store.web) under uvicorn."""

from __future__ import annotations

import asyncio
from typing import Optional

import typer

from .common import (
    DbOption, RedactConfigOption, RedactKeysOption, RedactOption, SchemaOption, UserError,
    fail, redactor_for, say, url_of, with_store,
)


def serve(host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but "
                                   "loopback needs --token."),
          port: int = typer.Option(8765, "--port", min=0, max=65535,
                                   help="Port to bind; 0 picks a free one."),
          token: Optional[str] = typer.Option(None, "--token", envvar="SESSION_STORE_WEB_TOKEN",
                                              help="Require this token (16 characters or "
                                              "more) on every request."),
          session_hours: float = typer.Option(8.0, "--session-hours", min=0.01,
                                              help="A browser signed in with the token "
                                              "stays signed in this long."),
          behind_tls: bool = typer.Option(False, "--behind-tls",
                                          help="Browsers reach the viewer through a TLS "
                                          "proxy: the session cookie is Secure."),
          redact: bool = RedactOption, redact_keys: Optional[str] = RedactKeysOption,
          redact_config: Optional[str] = RedactConfigOption,
          db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption) -> None:
    """Serve the read-only web viewer (call list, timelines, state inspector, export)."""
    from ..web import check_bind, create_app

    try:
        check_bind(host, token)
    except ValueError as exc:
        fail(str(exc))
    redactor = redactor_for(redact, redact_keys, redact_config)
    # The app opens the store in its lifespan, where a failure is uvicorn's traceback: a
    # store that cannot be opened (bad URL, no schema, down) is told here, in one line.
    with_store(db, schema, lambda store: asyncio.sleep(0))
    import uvicorn

    try:
        url = url_of(db)
    except UserError as exc:
        fail(str(exc))
    web = create_app(url, schema=schema, token=token, redaction=redactor.config,
                     session_max_age_s=int(session_hours * 3600), behind_tls=behind_tls)
    say(f"session-store viewer on http://{host}:{port}/" + (" (token required)" if token else ""))
    uvicorn.run(web, host=host, port=port, log_level="warning")
