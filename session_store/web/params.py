"""What a request asks for: the call it names, its numeric parameters, and a call's URL.

Every route is a fixed prefix followed by the call id as the rest of the path (`/calls/ID`,
`/export/ID`, `/api/timeline/ID`, …), so any stored id, slashes and all, names exactly one
call; an id a browser would rewrite as a path (".", "..") goes as `?id=` instead (`href`).
"""

from __future__ import annotations

from typing import overload
from urllib.parse import quote, urlencode

from starlette.requests import Request

_PATH_UNSAFE = {"", ".", ".."}


def href(kind: str, call_id: str, **params) -> str:
    """The URL of a call's page or answer: /KIND/ID (the id percent-encoded whole, so a
    slash in it stays part of it), or /KIND?id=ID for an id a browser would rewrite."""
    query = {k: v for k, v in params.items() if v is not None}
    if call_id in _PATH_UNSAFE:
        return f"/{kind}?" + urlencode({"id": call_id, **query})
    return f"/{kind}/{quote(call_id, safe='')}" + (f"?{urlencode(query)}" if query else "")


@overload
def int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int: ...
@overload
def int_param(request: Request, name: str, default: None, lo: int, hi: int) -> int | None: ...
def int_param(request: Request, name: str, default: int | None, lo: int,
              hi: int) -> int | None:
    value = _given(request, name, int, "a whole number")
    return default if value is None else min(max(value, lo), hi)


def float_param(request: Request, name: str, default: float, lo: float,
                hi: float) -> float:
    value = _given(request, name, float, "a number")
    return default if value is None or value != value else min(max(value, lo), hi)


def _given(request: Request, name: str, convert, what: str):
    """The parameter converted (None: not given), or a 400 that says what it must be."""
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        return convert(raw)
    except ValueError:
        raise BadRequest(f"{name} must be {what}") from None


async def point_param(request: Request, name: str, store, call_id: str,
                      head: int) -> int | None:
    """A point of the call as the CLI's `--at` takes it (20, +1.6s, an ISO time), as a
    version; a 400 for one that is not a point or lies outside versions 1–head (a silent
    clamp would show another event than the one asked for)."""
    from ..audit.queries.points import version_of_point

    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        version = await version_of_point(store, call_id, raw)
    except ValueError as exc:
        raise BadRequest(f"{name}: {exc}") from None
    if not 1 <= version <= head:
        raise BadRequest(f"{name}={raw}: the call has versions 1–{head}")
    return version


class BadRequest(Exception):
    """A parameter the viewer cannot take: a 400 with the reason."""


def call_id_of(request: Request) -> str:
    return request.path_params.get("call_id") or request.query_params.get("id", "")

