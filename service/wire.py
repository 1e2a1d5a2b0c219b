"""Server frames the service cannot take in as they are: found, described, never fatal.

google-genai's `AsyncSession._receive` reads one websocket frame, parses it and returns a
`LiveServerMessage`. A frame it cannot parse raises (invalid JSON: ValueError; a known message
of the wrong shape: pydantic's ValidationError; a JSON object with no field it knows, such as a
message type newer than the SDK: a TypeError from its error path), and pipecat's receive loop
takes any exception as a broken connection: it reconnects, counts a failure, and after three
within 10 s gives the service up. Unknown top-level fields next to known ones are dropped
without a word. `guard_session` wraps the session's `_receive` so that such a frame is
reported to the service (which logs it as an `AnomalyRecorded` and decides what follows, in
session_store.decide) and the loop reads on; errors of the socket itself still go to pipecat.

The wrapped hooks (`AsyncSession._receive`, `AsyncSession._ws`) are private: pinned by
tests/service/test_pipecat_contract.py.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from google.genai import types
from pydantic.alias_generators import to_camel
from websockets.exceptions import ConnectionClosed

#: Top-level fields of a server message the installed SDK understands (its own model's).
KNOWN_FIELDS = frozenset(to_camel(name) for name in types.LiveServerMessage.model_fields)
#: A frame the SDK did parse is parsed again for unknown top-level fields only up to this
#: size: every audio chunk takes that path, a multi-megabyte tool call need not.
CHECK_FIELDS_UP_TO = 64 * 1024
PREVIEW_BYTES = 200
#: google-genai's websocket client refuses frames over this (websockets' default) unless told
#: otherwise; the service raises it (see `with_frame_limit`).
SDK_DEFAULT_FRAME_LIMIT = 1 << 20
#: The close code of a frame over the limit: the client closes the socket itself, and the SDK
#: reports that as 1006 (it reads only a close the server sent): the tap keeps the real one.
MESSAGE_TOO_BIG = 1009


@dataclass(frozen=True)
class Rejection:
    """Why a frame was not (fully) taken in. `once` names what to log once per call only."""

    kind: str
    detail: dict[str, Any] = field(default_factory=dict)
    once: str | None = None


def classify(frame: bytes | str, error: Exception | None) -> Rejection | None:
    """What is wrong with a frame: `error` is what the SDK raised on it, None if it parsed
    it (then only unknown top-level fields, which it dropped, are reported; None if none)."""
    if error is None and _only_known_fields(frame):
        return None  # every audio chunk: the parse alone, no copy of the frame
    raw = frame.encode("utf-8", "backslashreplace") if isinstance(frame, str) else bytes(frame)
    base: dict[str, Any] = {"bytes": len(raw),
                            "frame": raw[:PREVIEW_BYTES].decode("utf-8", "backslashreplace")}
    if error is not None:
        base["error"] = f"{type(error).__name__}: {str(error)[:PREVIEW_BYTES]}"
    try:
        data = json.loads(raw) if raw.strip() else {}
    except ValueError:  # not JSON, or not UTF-8
        return Rejection("malformed_message", base) if error is not None else None
    if not isinstance(data, dict):
        return Rejection("malformed_message", {**base, "what": "not a JSON object"}) \
            if error is not None else None
    keys = sorted(str(k)[:100] for k in data)
    unknown = [k for k in keys if k not in KNOWN_FIELDS]
    if error is None and keys and not unknown:
        return None
    if error is not None and len(unknown) < len(keys):
        # A message type we know in a shape we cannot read: it may have been a toolCall.
        return Rejection("malformed_message", {**base, "fields": keys})
    if error is not None and ("error" in data or "code" in data):
        return Rejection("server_error_message", {**base, "fields": keys})
    # Nothing we know (a newer message type, an empty message) or extra fields next to known
    # ones: a forward-compatible client reads on. Logged once per set of field names.
    return Rejection("unknown_message", {"fields": unknown, "bytes": len(raw),
                                         "frame": base["frame"]}, once=",".join(unknown)[:200])


def _only_known_fields(frame: bytes | str) -> bool:
    """Is the frame a JSON object of known top-level fields only (at least one)?"""
    try:
        data = json.loads(frame)
    except ValueError:
        return False
    return isinstance(data, dict) and bool(data) and KNOWN_FIELDS.issuperset(data)


class _FrameTap:
    """Stands in for the session's websocket: remembers the last frame it handed out, or how
    the socket closed."""

    def __init__(self, ws: Any):
        self._ws = ws
        self.frame: bytes | str | None = None
        self.closed: ConnectionClosed | None = None

    async def recv(self, *args: Any, **kwargs: Any) -> Any:
        try:
            self.frame = await self._ws.recv(*args, **kwargs)
        except ConnectionClosed as exc:
            self.closed = exc
            raise
        return self.frame

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ws, name)


def guard_session(session: Any, report: Callable[[Rejection], Awaitable[None]],
                  frame_limit: int | None = None) -> None:
    """Make `session.receive()` skip (after `report`ing) the frames the SDK cannot parse.

    A frame that fails is consumed; whether the session must be replaced because of it is the
    service's decision. Errors with no frame behind them (the socket closed or failed) are
    raised as before, for pipecat's reconnect; a frame over the size limit is reported first.
    """
    tap = _FrameTap(session._ws)
    session._ws = tap
    receive = session._receive

    async def tolerant_receive():
        while True:
            tap.frame = None
            try:
                message = await receive()
            except Exception as exc:
                if tap.frame is None:
                    close = tap.closed and (tap.closed.sent or tap.closed.rcvd)
                    if close is not None and close.code == MESSAGE_TOO_BIG:
                        await report(Rejection("message_too_big", {
                            "limit": frame_limit or SDK_DEFAULT_FRAME_LIMIT,
                            "error": str(tap.closed)[:PREVIEW_BYTES]}))
                    raise
                rejection = classify(tap.frame, exc)
                await report(rejection or Rejection("malformed_message", {
                    "error": f"{type(exc).__name__}: {str(exc)[:PREVIEW_BYTES]}"}))
                continue
            frame = tap.frame
            if frame is not None and len(frame) <= CHECK_FIELDS_UP_TO:
                rejection = classify(frame, None)
                if rejection is not None:
                    await report(rejection)
            return message

    session._receive = tolerant_receive


def with_frame_limit(http_options: Any, limit: int) -> Any:
    """`http_options` with the websocket frame limit set to `limit` unless it sets one.

    google-genai hands `async_client_args` entries that `websockets.connect` accepts to it
    (and leaves them out of its HTTP clients), so this is the SDK's own way to set it."""
    if http_options is None:
        return {"async_client_args": {"max_size": limit}}
    if isinstance(http_options, dict):
        args = dict(http_options.get("async_client_args") or {})
        args.setdefault("max_size", limit)
        return {**http_options, "async_client_args": args}
    args = dict(getattr(http_options, "async_client_args", None) or {})
    args.setdefault("max_size", limit)
    return http_options.model_copy(update={"async_client_args": args})
