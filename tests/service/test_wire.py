"""service/wire.py's verdict on server frames (pure; the real receive path is exercised by
tests/faults/test_hostile_wire.py)."""

from __future__ import annotations

import base64
import json
import random

import pytest
from websockets.exceptions import ConnectionClosedError
from websockets.frames import Close

from service.wire import KNOWN_FIELDS, audio_chunk, classify, guard_session, with_frame_limit

FAILED = ValueError("the SDK raised")


@pytest.mark.parametrize("frame,kind", [
    (b"{not json", "malformed_message"),
    (b"\xff\xfe", "malformed_message"),                     # not UTF-8
    (b"[1, 2]", "malformed_message"),                       # not an object
    (b'{"toolCall": {"functionCalls": "x"}}', "malformed_message"),  # known, bad shape
    (b'{"error": {"code": 500}}', "server_error_message"),
    (b'{"code": 503, "message": "busy"}', "server_error_message"),
    (b'{"brandNewMessage": {}}', "unknown_message"),
])
def test_frames_the_sdk_refused(frame, kind):
    rejection = classify(frame, FAILED)
    assert rejection.kind == kind
    if kind != "unknown_message":
        assert rejection.detail["error"] == "ValueError: the SDK raised"
        assert rejection.once is None


def test_frames_the_sdk_took_are_reported_only_for_fields_it_dropped():
    assert classify(b'{"serverContent": {"turnComplete": true}}', None) is None
    assert classify(b"{not json", None) is None  # the SDK would have raised
    extra = classify(b'{"usageMetadata": {}, "zExtra": 1, "aExtra": 2}', None)
    assert (extra.kind, extra.detail["fields"], extra.once) == (
        "unknown_message", ["aExtra", "zExtra"], "aExtra,zExtra")
    assert classify(b"{}", None).once == ""


def test_details_are_bounded():
    huge = b'{"toolCall": ' + b'"' + b"x" * 5_000_000 + b'"}'
    rejection = classify(huge, ValueError("Failed to parse response: " + "y" * 10_000))
    assert rejection.detail["bytes"] == len(huge)
    assert len(rejection.detail["frame"]) == 200 and len(rejection.detail["error"]) < 300


def test_the_known_fields_are_the_sdks():
    assert {"setupComplete", "serverContent", "toolCall", "toolCallCancellation",
            "goAway", "sessionResumptionUpdate", "usageMetadata"} <= KNOWN_FIELDS


def test_frame_limit_never_overrides_the_apps_own():
    assert with_frame_limit({"async_client_args": {"max_size": 7}}, 99)[
        "async_client_args"]["max_size"] == 7
    assert with_frame_limit(None, 99) == {"async_client_args": {"max_size": 99}}


# ------------------------------------------------------------------ the audio chunk fast path

def sdk_parse(frame: bytes):
    """What google-genai's own `_receive` makes of a frame (Gemini API, not Vertex)."""
    from google.genai import _live_converters, types
    response = json.loads(frame)
    return types.LiveServerMessage._from_response(
        response=_live_converters._LiveServerMessage_from_mldev(response),
        kwargs=types.LiveServerMessage().model_dump())


def chunk_frame(data: str, mime_type: str = "audio/pcm;rate=24000", role=(), **extra) -> bytes:
    blob = {"mimeType": mime_type, "data": data}
    turn = {"parts": [{"inlineData": blob}], **({"role": role} if role != () else {})}
    return json.dumps({"serverContent": {"modelTurn": turn}, **extra}).encode()


@pytest.mark.parametrize("size", [0, 1, 2, 3, 960, 1920, 4801])
@pytest.mark.parametrize("mime_type", ["audio/pcm;rate=24000", "audio/pcm"])
@pytest.mark.parametrize("role", [(), "model", None])
def test_an_audio_chunk_is_the_message_the_sdk_makes_of_it(size, mime_type, role):
    audio = random.Random(size).randbytes(size)
    frame = chunk_frame(base64.b64encode(audio).decode(), mime_type, role)
    fast, sdk = audio_chunk(json.loads(frame)), sdk_parse(frame)
    assert fast == sdk
    assert fast.model_dump(exclude_unset=True) == sdk.model_dump(exclude_unset=True)
    assert fast.server_content.model_turn.parts[0].inline_data.data == audio
    assert fast.data == sdk.data  # what pipecat reads


@pytest.mark.parametrize("frame", [
    chunk_frame(base64.urlsafe_b64encode(b"\xfb\xff\xfe" * 10).decode()),  # the SDK reads it
    chunk_frame("YWJj"[:3]),                                                # unpadded
    chunk_frame("!!not base64"),                                            # the SDK refuses
    chunk_frame("AAAA", usageMetadata={}),                                  # more than audio
    chunk_frame("AAAA", mime_type=7),
    chunk_frame("AAAA", role=1),
    json.dumps({"serverContent": {"modelTurn": {"parts": [
        {"inlineData": {"mimeType": "audio/pcm", "data": "AAAA"}}, {"text": "hi"}]}}}).encode(),
    json.dumps({"serverContent": {"modelTurn": {"parts": [{"inlineData": {
        "mimeType": "audio/pcm", "data": "AAAA"}}]}, "turnComplete": True}}).encode(),
    json.dumps({"serverContent": {"modelTurn": {"role": "model", "x": 1, "parts": [{
        "inlineData": {"mimeType": "audio/pcm", "data": "AAAA"}}]}}}).encode(),
    json.dumps({"serverContent": {"outputTranscription": {"text": "hi"}}}).encode(),
    json.dumps({"toolCall": {"functionCalls": []}}).encode(),
    b"[1]", b"{}", b'"x"',
])
def test_anything_else_goes_to_the_sdks_parse(frame):
    assert audio_chunk(json.loads(frame)) is None


class FakeSocket:
    """Frames in order, then a close from the server."""

    def __init__(self, frames):
        self.frames = list(frames)

    async def recv(self, decode=None):
        if not self.frames:
            raise ConnectionClosedError(Close(1011, "gone"), None)
        return self.frames.pop(0)


async def test_the_guarded_receive_gives_what_the_sdk_gives_and_reports_the_rest():
    from google import genai
    from google.genai.live import AsyncSession
    import google.genai.errors  # noqa: F401 - genai.errors below
    audio = base64.b64encode(b"\x01\x02" * 480).decode()
    frames = [chunk_frame(audio, role="model"), b'{"serverContent": {"turnComplete": true}}',
              chunk_frame(base64.urlsafe_b64encode(b"\xfb\xff" * 3).decode()),
              b"{not json", b'{"usageMetadata": {}, "zExtra": 1}', chunk_frame(audio)]
    client = genai.Client(api_key="x")  # (the Gemini API: Vertex's frames all go the SDK's way)
    session = AsyncSession(api_client=client._api_client, websocket=FakeSocket(frames))
    reports = []

    async def report(rejection):
        reports.append(rejection.kind)
    guard_session(session, report)
    got = [await session._receive() for _ in range(4)]
    assert got == [sdk_parse(frames[0]), sdk_parse(frames[1]), sdk_parse(frames[2]),
                   sdk_parse(frames[4])]
    assert reports == ["malformed_message", "unknown_message"]
    assert await session._receive() == sdk_parse(frames[5])
    with pytest.raises(genai.errors.APIError) as closed:  # the SDK's own error for the close
        await session._receive()
    assert closed.value.code == 1011


def test_the_empty_messages_chunks_are_copied_from_share_nothing():
    from service.wire import _EMPTY
    for empty in _EMPTY.values():
        assert all(value is None for value in empty.__dict__.values()), type(empty)
