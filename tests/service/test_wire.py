"""service/wire.py's verdict on server frames (pure; the real receive path is exercised by
tests/faults/test_hostile_wire.py)."""

from __future__ import annotations

import pytest

from service.wire import KNOWN_FIELDS, classify, with_frame_limit

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
