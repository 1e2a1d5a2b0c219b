"""The read-only web viewer: call list, fleet page, per-call timeline with swimlanes (live for
an open call), state inspector, export.

Starlette, server-rendered HTML (Jinja2, autoescaped), inline SVG and one small script. This
module puts the app together: the routes to each page's handlers (call_list.py, fleet.py,
call_pages.py, over the shared viewer.py), the lifespan that opens the store read-only, the
error answers, and the security layers (security.py: the token gate, the signed session,
the headers on every answer). URLs and parameters: params.py. Redaction applies to every
page and API answer: secrets always, everything configured when the server or the request
asks.
"""

from __future__ import annotations

import contextlib
import secrets

from starlette.applications import Starlette
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from ..audit import RedactionConfig
from ..errors import SessionStoreError, StoreUnavailable
from .params import BadRequest
from .security import (
    COOKIE, SECURITY_HEADERS, SESSION_MAX_AGE_S, Gate, JSONResponse, SecurityHeaders, check_token,
)
from .call_list import CallList
from .call_pages import CallPages
from .deadline import within_outage_deadline
from .fleet import FleetPage
from .viewer import Viewer


def create_app(url: str, *, schema: str | None = None, token: str | None = None,
               redaction: RedactionConfig | None = None, page_size: int = 500,
               session_max_age_s: int = SESSION_MAX_AGE_S, session_secret: str | None = None,
               behind_tls: bool = False):
    """The viewer as an ASGI app (security headers, the signed session, the token gate).
    `session_secret` signs the session cookies (default: a new random one, so a restart
    signs every browser out). `behind_tls`: browsers reach it through a TLS proxy, so the
    session cookie is `Secure` (never sent over plain HTTP)."""
    viewer = Viewer(url, schema, redaction or RedactionConfig(), page_size)
    check_token(token)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        import anyio

        from ..storage import open_store

        viewer.store = await open_store(url, read_only=True,  # (a viewer never writes)
                                        **({"schema": schema} if schema else {}))
        viewer.stopping = anyio.Event()
        try:
            yield
        finally:
            viewer.stopping.set()  # live pages' streams end with the server
            await viewer.store.close()

    def guard(handler):
        async def run(request: Request) -> Response:
            api = request.url.path.startswith(("/api/", "/export"))
            try:
                return await within_outage_deadline(handler(request), viewer.store)
            except BadRequest as exc:
                if api:
                    return JSONResponse({"error": str(exc)}, 400, headers=SECURITY_HEADERS)
                return viewer.page("error.html", 400, title="bad request", message=str(exc),
                                   redact=False)
            except SessionStoreError as exc:
                # The reason may quote a stored value (a field of the wrong type): scrubbed
                # of credentials, as every answer is. An outage is 503, not the log's fault.
                message = viewer.redactors[False].scrub_text(str(exc))
                status = 503 if isinstance(exc, StoreUnavailable) else 500
                if api:
                    return JSONResponse({"error": message}, status, headers=SECURITY_HEADERS)
                return viewer.page("error.html", status, message=message, redact=False,
                                   title="the database does not answer" if status == 503
                                   else "cannot read the log")
        return run

    async def not_found(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": "not found"}, 404, headers=SECURITY_HEADERS)
        return viewer.page("error.html", 404, title="not found",
                           message=f"nothing at {request.url.path}", redact=False)

    calls, fleet, call = CallList(viewer), FleetPage(viewer), CallPages(viewer)
    routes = [Route("/", guard(calls.calls_page)), Route("/fleet", guard(fleet.fleet_page)),
              Route("/api/calls", guard(calls.calls_api)),
              Route("/api/stats", guard(fleet.stats_api)),
              Route("/static/{name}", viewer.static)]
    # Each call route twice: the id as the rest of the path, or as ?id= (see `href`).
    for prefix, handler in (("/calls", call.call_page), ("/export", call.export),
                            ("/api/timeline", call.timeline_api),
                            ("/api/state", call.state_api),
                            ("/api/replay", call.replay_api),
                            ("/api/live", call.live)):
        routes += [Route(prefix + "/{call_id:path}", guard(handler)),
                   Route(prefix, guard(handler))]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found})
    app.state.viewer = viewer
    gated: ASGIApp = Gate(app, token)
    if token is not None:
        gated = SessionMiddleware(gated, secret_key=session_secret or secrets.token_urlsafe(32),
                                  session_cookie=COOKIE, max_age=session_max_age_s,
                                  same_site="strict", https_only=behind_tls)
    return SecurityHeaders(gated)
