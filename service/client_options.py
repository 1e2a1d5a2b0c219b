"""One TLS context for every google-genai client of the process.

Each `google.genai.Client` builds up to three `ssl.SSLContext`s of its own (httpx, aiohttp,
websockets), each parsing the whole CA bundle: 60-110 ms of blocked event loop per client,
and pipecat makes one client per service, i.e. per call. On a worker that is a silence in
every other call's audio whenever a call starts or is taken over (issue #32, item 5). An
SSLContext is safe to share between connections, so the process makes one, from the same
bundle the SDK would read, and gives it to every transport of every client.
"""

from __future__ import annotations

import functools
import os
import ssl
from typing import Any

import certifi


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """The process-wide client context: the CA bundle google-genai uses by default
    (SSL_CERT_FILE / SSL_CERT_DIR, else certifi's), parsed once."""
    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE", certifi.where()),
                                      capath=os.environ.get("SSL_CERT_DIR"))


def with_shared_tls(http_options: Any, context: ssl.SSLContext | None = None) -> Any:
    """`http_options` (None, a dict or `HttpOptions`) whose transports all use one TLS context:
    `context` if given, else the `ssl` the caller set in `async_client_args` (a private CA,
    the local server's certificate), else `shared_tls_context()`. google-genai reads `ssl`
    for its websocket and aiohttp transports and `verify` for httpx; a caller's own value of
    either is kept."""
    get = (http_options.get if isinstance(http_options, dict)
           else lambda key: getattr(http_options, key, None))
    args = dict(get("async_client_args") or {})
    chosen = context or args.get("ssl") or shared_tls_context()
    args.setdefault("ssl", chosen)
    args.setdefault("verify", chosen)
    update = {"async_client_args": args}
    if client_args := get("client_args"):  # the sync client reads its own args first
        update["client_args"] = {"verify": chosen, **client_args}
    if http_options is None:
        return update
    if isinstance(http_options, dict):
        return {**http_options, **update}
    return http_options.model_copy(update=update)
