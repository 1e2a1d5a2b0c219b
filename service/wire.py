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

Most frames are one chunk of the model's audio. The SDK parses each through its generic path
(a converter, a walk for unknown fields, pydantic validation: about half the worker's CPU for
the frame at 20 live calls, bench/receive_parse.py); `audio_chunk` builds exactly that
message from the parsed JSON, and anything else, or a chunk it would read differently, goes
to the SDK's own parse.

The wrapped hooks (`AsyncSession._receive`, `AsyncSession._ws`) are private: pinned by
tests/service/test_pipecat_contract.py.
"""

from __future__ import annotations

import base64
import binascii
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


def audio_chunk(data: Any) -> types.LiveServerMessage | None:
    """The message of a parsed frame that is one chunk of the model's audio and nothing else,
    as the SDK's parse would give it; None for any other frame (the SDK parses those). Only
    strict standard base64 is taken here: the SDK also reads url-safe or unpadded data, and
    refuses the rest, so those go to it."""
    if not (isinstance(data, dict) and len(data) == 1):
        return None
    content = data.get("serverContent")
    turn = content.get("modelTurn") if isinstance(content, dict) and len(content) == 1 else None
    if not isinstance(turn, dict):
        return None
    role = turn.get("role")  # (a turn's role may come with it, or not)
    if not (len(turn) == 1 + ("role" in turn) and (role is None or isinstance(role, str))):
        return None
    parts = turn.get("parts")
    part = parts[0] if isinstance(parts, list) and len(parts) == 1 else None
    blob = part.get("inlineData") if isinstance(part, dict) and len(part) == 1 else None
    if not (isinstance(blob, dict) and len(blob) == 2):
        return None
    mime_type, encoded = blob.get("mimeType"), blob.get("data")
    if not (isinstance(mime_type, str) and isinstance(encoded, str)):
        return None
    try:
        audio = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    # Built without validation: every value is checked above to be what validation makes it.
    # (Copies of empty messages: constructing fills each model's dozen defaults, 3x the time.)
    blob = _EMPTY[types.Blob].model_copy(update={"mime_type": mime_type, "data": audio})
    turn = _EMPTY[types.Content].model_copy(update={
        "parts": [_EMPTY[types.Part].model_copy(update={"inline_data": blob})],
        **({"role": role} if "role" in turn else {})})
    return _EMPTY[types.LiveServerMessage].model_copy(update={
        "server_content": _EMPTY[types.LiveServerContent].model_copy(
            update={"model_turn": turn})})


#: The messages an audio chunk is made of, empty; every field None, so shallow copies of them
#: share nothing (tests/service/test_wire.py).
_EMPTY: dict[type, Any] = {cls: cls.model_construct() for cls in (
    types.LiveServerMessage, types.LiveServerContent, types.Content, types.Part, types.Blob)}


_NOTHING = object()


class _FrameTap:
    """Stands in for the session's websocket: reads a frame ahead for the service to look at
    (`read_ahead`), hands it to the SDK's next `recv` if the service does not take it, and
    remembers the last frame it handed out, or how the socket closed."""

    def __init__(self, ws: Any):
        self._ws = ws
        self.frame: bytes | str | None = None
        self.closed: ConnectionClosed | None = None
        self._ahead: Any = _NOTHING  # a frame read ahead, or what reading it raised

    async def read_ahead(self) -> bytes | str | None:
        """The next frame, kept for the SDK's next `recv`; None if reading failed (the SDK
        then meets the failure itself)."""
        if self._ahead is not _NOTHING:  # (still unread by the SDK: never dropped)
            return None if isinstance(self._ahead, BaseException) else self._ahead
        try:
            try:
                self._ahead = await self._ws.recv(decode=False)
            except TypeError:  # (an older websockets: no `decode`)
                self._ahead = await self._ws.recv()
        except Exception as exc:  # noqa: BLE001 - raised again at the SDK's recv, as before
            self._ahead = exc
            return None
        return self._ahead

    async def recv(self, *args: Any, **kwargs: Any) -> Any:
        ahead, self._ahead = self._ahead, _NOTHING
        if isinstance(ahead, BaseException):
            if isinstance(ahead, ConnectionClosed):
                self.closed = ahead
            raise ahead
        try:
            self.frame = ahead if ahead is not _NOTHING else await self._ws.recv(*args, **kwargs)
        except ConnectionClosed as exc:
            self.closed = exc
            raise
        return self.frame

    def taken(self) -> None:
        """The frame read ahead was taken in by the service: the SDK reads the next one."""
        self.frame, self._ahead = self._ahead, _NOTHING

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

    # (Vertex's frames go through a converter first: the SDK parses all of them.)
    fast = not getattr(getattr(session, "_api_client", None), "vertexai", True)

    async def tolerant_receive() -> Any:
        while True:
            tap.frame = None
            parsed: Any = None
            if fast:
                frame = await tap.read_ahead()
                if frame is not None and len(frame) <= CHECK_FIELDS_UP_TO:
                    try:
                        parsed = json.loads(frame)
                    except ValueError:
                        pass  # the SDK raises on it, and it is classified below
                    chunk = audio_chunk(parsed)
                    if chunk is not None:
                        tap.taken()
                        return chunk
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
            if isinstance(parsed, dict) and parsed and KNOWN_FIELDS.issuperset(parsed):
                return message  # (parsed once already: the check below would again)
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
