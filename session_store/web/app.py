"""The read-only web viewer: call list, per-call timeline with swimlanes, state inspector, export.

Starlette, server-rendered HTML (Jinja2, autoescaped) and inline SVG; one small script for the
state inspector. Security: binds to 127.0.0.1 by default and refuses a non-loopback address
without a token (`check_bind`); with a token every request must carry it (`Authorization:
Bearer T`, or `?token=T` once, which sets a cookie); without one, only requests addressed to
a loopback host name are answered (no DNS rebinding). Redaction applies to every page and
API answer: secrets always, everything configured when the server or the request asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import re
import time
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import (HTMLResponse, JSONResponse, PlainTextResponse, Response,
                                 StreamingResponse)
from starlette.routing import Route

from ..audit import (CallFilter, RedactionConfig, Redactor, build_timeline, export_line,
                     parse_policy, parse_time, replay, state_view)
from ..audit.queries import (StateCache, call_summary, complete_head, count_calls,
                             iter_records, list_calls, overview, state_at)
from ..audit.summaries import STATUSES
from ..errors import SessionStoreError
from ..projection import fold
from ..schema import valid_id
from .svg import lanes_svg, overview_svg

HERE = Path(__file__).resolve().parent
COOKIE = "session_store_viewer"
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
    "cache-control": "no-store", "x-frame-options": "DENY"}


# ------------------------------------------------------------------------ binding and auth

def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name could resolve to anything


def check_token(token: str | None) -> None:
    """A token, when given, must be one: an empty one (an empty $SESSION_STORE_WEB_TOKEN)
    would let `?token=` in, and with a token set the loopback-host rule is off."""
    if token is not None and not token.strip():
        raise ValueError("the viewer's token is empty: set a real one (--token or "
                         "$SESSION_STORE_WEB_TOKEN), or none to serve on loopback only")


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve call logs on a non-loopback address without a token."""
    check_token(token)
    if not is_loopback(host) and not token:
        raise ValueError(f"refusing to bind to {host}: it is not a loopback address, so the "
                         "viewer needs --token (or $SESSION_STORE_WEB_TOKEN); every request "
                         "must then carry it")


def _host_of(header: str) -> str:
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


async def _plain(send, status: int, text: str, extra: list[tuple[bytes, bytes]] = ()) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


class Gate:
    """ASGI middleware: the token rule (or, without a token, the loopback-host rule)."""

    def __init__(self, app, token: str | None):
        check_token(token)
        self.app, self.token = app, token
        self.cookie = (hashlib.sha256(f"session-store-viewer\x1f{token}".encode()).hexdigest()
                       if token else None)

    def _ok(self, given: str | None, expected: str) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), expected.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        if self.token is None:
            if not is_loopback(_host_of(headers.get("host", ""))):
                return await _plain(send, 403, "forbidden: this viewer answers only requests "
                                    "addressed to a loopback host (serve it with --token to "
                                    "allow others)")
            return await self.app(scope, receive, send)
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and self._ok(auth[7:].strip(), self.token):
            return await self.app(scope, receive, send)
        cookies = SimpleCookie()
        with contextlib.suppress(Exception):
            cookies.load(headers.get("cookie", ""))
        if COOKIE in cookies and self._ok(cookies[COOKIE].value, self.cookie):
            return await self.app(scope, receive, send)
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                          keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if self._ok(given, self.token):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            # One leading slash: "//host/…" would send the browser to another site.
            location = "/" + quote(scope["path"]).lstrip("/") + (f"?{rest}" if rest else "")
            cookie = (f"{COOKIE}={self.cookie}; HttpOnly; SameSite=Strict; Path=/").encode()
            return await _plain(send, 303, "authenticated", [(b"location", location.encode()),
                                                             (b"set-cookie", cookie)])
        return await _plain(send, 401, "unauthorized: this viewer needs its token "
                            "(Authorization: Bearer TOKEN, or ?token=TOKEN once)",
                            [(b"www-authenticate", b'Bearer realm="session-store"')])


# ------------------------------------------------------------------------ the app

def _int(request: Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _BadRequest(f"{name} must be a whole number") from None
    return min(max(value, lo), hi)


class _BadRequest(Exception):
    pass


class Viewer:
    """Request handlers over one store (opened in the app's lifespan)."""

    def __init__(self, url: str, schema: str | None, redaction: RedactionConfig,
                 page_size: int = 500):
        self.url, self.schema, self.page_size = url, schema, page_size
        self.store = None
        self.cache = StateCache()
        self.redactors = {False: Redactor(redaction), True: Redactor(redaction.with_enabled())}
        self.forced = redaction.enabled
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                 autoescape=True, undefined=jinja2.StrictUndefined)
        env.filters["q"] = lambda s: quote(str(s), safe="")
        self.env = env

    def redacting(self, request: Request) -> bool:
        return self.forced or request.query_params.get("redact") in ("1", "true", "yes", "on")

    def redactor(self, request: Request) -> Redactor:
        return self.redactors[self.redacting(request)]

    def page(self, name: str, status: int = 200, **ctx) -> HTMLResponse:
        html = self.env.get_template(name).render(**ctx)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def not_found(self, request: Request, call_id: str, api: bool) -> Response:
        if api:
            return JSONResponse({"error": "not found", "call": call_id}, 404,
                                headers=SECURITY_HEADERS)
        return self.page("error.html", 404, title="not found",
                         message=f"call {call_id!r} not found", redact=self.redacting(request))

    # -------------------------------------------------------------- call list
    def _filter(self, request: Request) -> CallFilter:
        qp = request.query_params
        status = qp.get("status") or None
        if status is not None and status not in STATUSES:
            raise _BadRequest(f"status must be one of {', '.join(STATUSES)}")
        try:
            return CallFilter(parse_time(qp.get("since")), parse_time(qp.get("until")), status,
                              qp.get("q") or None, qp.get("after") or None,
                              _int(request, "limit", 50, 1, 500))
        except ValueError as exc:
            raise _BadRequest(str(exc)) from None

    async def _list_calls(self, flt: CallFilter, now_us: int):
        try:
            return await list_calls(self.store, flt, now_us)
        except ValueError as exc:  # `after` names no call
            raise _BadRequest(str(exc)) from None

    async def calls_page(self, request: Request) -> Response:
        flt = self._filter(request)
        now = time.time_ns() // 1000
        page = await self._list_calls(flt, now)
        total = await count_calls(self.store, CallFilter(flt.since_us, flt.until_us, flt.status,
                                                         flt.search), now)
        params = {k: v for k, v in request.query_params.items() if k not in ("after", "token")}
        return self.page("calls.html", calls=page.calls, total=total, flt=flt,
                         q=request.query_params, statuses=STATUSES, redact=self.redacting(request),
                         next_href=("?" + urlencode({**params, "after": page.next_after})
                                    if page.next_after else None))

    async def calls_api(self, request: Request) -> Response:
        page = await self._list_calls(self._filter(request), time.time_ns() // 1000)
        return JSONResponse(page.to_json(), headers=SECURITY_HEADERS)

    # -------------------------------------------------------------- one call
    async def _window(self, request: Request, call_id: str):
        if not await complete_head(self.store, call_id):  # damaged: StreamDamaged, a 500
            return None
        summary = await call_summary(self.store, call_id, time.time_ns() // 1000)
        if summary is None:
            return None
        n = _int(request, "n", self.page_size, 1, 5000)
        first = _int(request, "from", 1, 1, max(summary.events, 1))
        recs = await self.store.read(call_id, from_version=first, to_version=first + n - 1)
        final = fold(recs) if first == 1 and summary.events <= n else None
        tl = build_timeline(self.redactor(request).redact_records(recs), call_id=call_id,
                            t0_us=summary.started_at_us, final_state=final)
        return summary, tl, first, n

    async def call_page(self, request: Request) -> Response:
        call_id = request.path_params.get("call_id") or request.query_params.get("id", "")
        found = await self._window(request, call_id) if valid_id(call_id) else None
        if found is None:
            return self.not_found(request, call_id, api=False)
        summary, tl, first, n = found
        ov = await overview(self.store, call_id, summary.started_at_us, summary.last_event_at_us)
        redact = self.redacting(request)
        keep = {"n": n, **({"redact": "1"} if redact and not self.forced else {})}
        nav = {"first": 1 if first > 1 else None,
               "prev": max(1, first - n) if first > 1 else None,
               "next": first + n if first + n <= summary.events else None,
               "last": max(1, summary.events - n + 1) if first + n <= summary.events else None}
        return self.page("call.html", s=summary, tl=tl, first=first, n=n, nav=nav, keep=keep,
                         lanes=lanes_svg(tl), redact=redact, forced=self.forced,
                         overview=overview_svg(ov, (tl.start_us, tl.end_us)
                                               if tl.start_us else None, keep),
                         tool_calls=list(tl.tool_calls.values()))

    async def timeline_api(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        found = await self._window(request, call_id) if valid_id(call_id) else None
        if found is None:
            return self.not_found(request, call_id, api=True)
        summary, tl, _first, _n = found
        return JSONResponse({"summary": summary.to_json(), "timeline": tl.to_json()},
                            headers=SECURITY_HEADERS)

    async def state_api(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        at = _int(request, "at", None, 0, 2**62)
        found = await complete_head(self.store, call_id)
        s = await state_at(self.store, call_id, at, self.cache) if found else None
        if s is None:
            return self.not_found(request, call_id, api=True)
        redactor = self.redactor(request)
        event = None
        if s.version:
            rec = (await self.store.read(call_id, from_version=s.version,
                                         to_version=s.version))
            event = export_line(rec[0], redactor) if rec else None
        return JSONResponse({"at": s.version, "event": event,
                             "state": redactor.redact_state(state_view(s, call_id,
                                                                       max_items=100))},
                            headers=SECURITY_HEADERS)

    async def replay_api(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        head = await complete_head(self.store, call_id)
        if head == 0:
            return self.not_found(request, call_id, api=True)
        qp = request.query_params
        policy = parse_policy(qp.get("defer", "all"), qp.get("idempotent", ""),
                              qp.get("reuse", "all"))
        recs = await self.store.read(call_id, to_version=head)
        report = await asyncio.to_thread(replay, recs, policy, call_id=call_id)
        return JSONResponse(report.redacted(self.redactor(request)).to_json(),
                            headers=SECURITY_HEADERS)

    async def export(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        # Checked before the first byte goes out (a status cannot change mid-stream): a call
        # with events missing is refused with the reason, not exported as if it were whole.
        head = await complete_head(self.store, call_id)
        if head == 0:
            return self.not_found(request, call_id, api=True)
        redactor = self.redactor(request)

        async def lines():
            async for chunk in iter_records(self.store, call_id, to_version=head):
                yield "".join(json.dumps(export_line(r, redactor), sort_keys=True,
                                         ensure_ascii=False) + "\n" for r in chunk)

        name = re.sub(r"[^A-Za-z0-9._-]", "_", call_id)[:80] or "call"
        suffix = ".redacted" if redactor.enabled else ""
        return StreamingResponse(lines(), media_type="application/x-ndjson", headers={
            **SECURITY_HEADERS,
            "content-disposition": f'attachment; filename="{name}{suffix}.jsonl"'})

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        types = {"app.js": "text/javascript", "style.css": "text/css"}
        if name not in types:
            return PlainTextResponse("not found", 404)
        return Response((HERE / "static" / name).read_bytes(), media_type=types[name],
                        headers={**SECURITY_HEADERS, "cache-control": "max-age=300"})


def create_app(url: str, *, schema: str | None = None, token: str | None = None,
               redaction: RedactionConfig | None = None, page_size: int = 500):
    """The viewer as an ASGI app (wrapped in the token gate)."""
    viewer = Viewer(url, schema, redaction or RedactionConfig(), page_size)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        from ..storage import open_store

        viewer.store = await open_store(url, **({"schema": schema} if schema else {}))
        try:
            yield
        finally:
            await viewer.store.close()

    def guard(handler):
        async def run(request: Request) -> Response:
            api = request.url.path.startswith("/api/") or request.url.path.endswith(".jsonl")
            try:
                return await handler(request)
            except _BadRequest as exc:
                if api:
                    return JSONResponse({"error": str(exc)}, 400, headers=SECURITY_HEADERS)
                return viewer.page("error.html", 400, title="bad request", message=str(exc),
                                   redact=False)
            except SessionStoreError as exc:
                # The reason may quote a stored value (a field of the wrong type): scrubbed
                # of credentials, as every answer is.
                message = viewer.redactors[False].scrub_text(str(exc))
                if api:
                    return JSONResponse({"error": message}, 500, headers=SECURITY_HEADERS)
                return viewer.page("error.html", 500, title="cannot read the log",
                                   message=message, redact=False)
        return run

    routes = [
        Route("/", guard(viewer.calls_page)),
        Route("/api/calls", guard(viewer.calls_api)),
        Route("/api/calls/{call_id:path}/state", guard(viewer.state_api)),
        Route("/api/calls/{call_id:path}/timeline", guard(viewer.timeline_api)),
        Route("/api/calls/{call_id:path}/replay", guard(viewer.replay_api)),
        Route("/calls/{call_id:path}/export.jsonl", guard(viewer.export)),
        Route("/calls/{call_id:path}", guard(viewer.call_page)),
        Route("/call", guard(viewer.call_page)),
        Route("/static/{name}", viewer.static),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.viewer = viewer
    return Gate(app, token)
