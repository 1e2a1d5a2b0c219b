"""Who may read the viewer: the bind and token rules, and the security headers on every answer.

It binds to 127.0.0.1 by default and refuses a non-loopback address without a token
(`check_bind`, at least 16 characters); with a token every request must carry it
(`Authorization: Bearer T`), or a signed session cookie that expires (Starlette's
SessionMiddleware, itsdangerous, outside `Gate`), which `?token=T` sets once. Without one,
only requests addressed to a loopback host name are answered (no DNS rebinding). Every
answer, a 404 or a 401 included, carries the same security headers.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from urllib.parse import parse_qsl, quote, urlencode

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse as _StarletteJSON

from ..audit.jsontext import dumps

COOKIE = "session_store_viewer"
TOKEN_MIN = 16
SESSION_MAX_AGE_S = 8 * 3600
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
    "cache-control": "no-store", "x-frame-options": "DENY"}


class JSONResponse(_StarletteJSON):
    """Starlette's JSON answer, with bidi and C1 controls escaped (`jsontext`)."""

    def render(self, content) -> bytes:
        return dumps(content, allow_nan=False, separators=(",", ":")).encode("utf-8")


# A Host header: a name or an address, and a port. Anything else ("127.0.0.1:80@evil.example",
# a path, spaces) names no host this viewer is, whatever its first part says.
_HOST_HEADER = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::\d{1,5})?")


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name could resolve to anything


def check_token(token: str | None) -> None:
    """A token, when given, must be one: an empty or short one is guessable, and with a
    token set the loopback-host rule is off."""
    if token is not None and not token.strip():
        raise ValueError("the viewer's token is empty: set a real one (--token or "
                         "$SESSION_STORE_WEB_TOKEN), or none to serve on loopback only")
    if token is not None and len(token) < TOKEN_MIN:
        raise ValueError(f"the viewer's token is {len(token)} characters: use at least "
                         f"{TOKEN_MIN} (e.g. openssl rand -hex 16)")


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve call logs on a non-loopback address without a token."""
    check_token(token)
    if not is_loopback(host) and not token:
        raise ValueError(f"refusing to bind to {host}: it is not a loopback address, so the "
                         "viewer needs --token (or $SESSION_STORE_WEB_TOKEN); every request "
                         "must then carry it")


def _host_of(header: str) -> str:
    m = _HOST_HEADER.fullmatch(header.strip())
    return m.group(1).strip("[]") if m else ""


async def _plain(send, status: int, text: str, extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


class SecurityHeaders:
    """ASGI middleware: every response gets the security headers it does not set itself
    (a 404 from the router, the gate's 401, a static file)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for k, v in SECURITY_HEADERS.items():
                    if k not in headers:
                        headers[k] = v
            await send(message)

        return await self.app(scope, receive, with_headers)


class Gate:
    """ASGI middleware: the token rule (or, without a token, the loopback-host rule). A
    browser that showed the token once holds a signed session (SessionMiddleware, outside
    this one) that says so until it expires."""

    def __init__(self, app, token: str | None):
        check_token(token)
        self.app, self.token = app, token

    def _ok(self, given: str | None) -> bool:
        return (given is not None and self.token is not None
                and hmac.compare_digest(given.encode(), self.token.encode()))

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
        if auth[:7].lower() == "bearer " and self._ok(auth[7:].strip()):
            return await self.app(scope, receive, send)
        session = scope.get("session")
        if session is not None and session.get("signed_in") is True:
            return await self.app(scope, receive, send)
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                          keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if self._ok(given):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            # One leading slash: "//host/…" would send the browser to another site.
            location = "/" + quote(scope["path"]).lstrip("/") + (f"?{rest}" if rest else "")
            if session is not None:
                session["signed_in"] = True  # SessionMiddleware signs it into the cookie
            return await _plain(send, 303, "authenticated", [(b"location", location.encode())])
        return await _plain(send, 401, "unauthorized: this viewer needs its token "
                            "(Authorization: Bearer TOKEN, or ?token=TOKEN once)",
                            [(b"www-authenticate", b'Bearer realm="session-store"')])
