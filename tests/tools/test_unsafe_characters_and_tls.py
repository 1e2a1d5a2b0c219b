"""Issue #34 item 10: JSON outputs and `export` write bidi controls and C1 controls as escapes
(a terminal that shows `--json` acts on them raw); the Host check reads the whole header
(`127.0.0.1:80@evil.example` is not loopback); the session cookie is `Secure` when the
viewer is served behind TLS."""

from __future__ import annotations

import json

import pytest

from session_store import events as ev
from session_store.audit.jsontext import UNSAFE, dumps
from session_store.web.security import _host_of, is_loopback

from .conftest import running_viewer, viewer_client
from .helpers import acli, write_call

HOSTILE = "ok \u202eevil\u202c \u2066iso\u2069 \u009b31m c1 \u200bzw"
TOKEN = "a-token-for-tls-tests-0123456789"


def test_dumps_escapes_what_a_terminal_acts_on_and_keeps_the_value():
    text = dumps({"note": HOSTILE, "name": "Zoë 東京"})
    assert UNSAFE.search(text) is None
    assert "\\u202e" in text and "\\u009b" in text and "Zoë 東京" in text  # the rest readable
    assert json.loads(text) == {"note": HOSTILE, "name": "Zoë 東京"}


async def test_cli_json_outputs_and_export_escape_bidi_and_c1(migrated):
    await write_call(migrated, "bidi-1", [
        (0, ev.SessionOpened("gemini-live", ["lookup"], "w1", 1)), (0, ev.Connected(1)),
        (100, ev.ToolCallRequested("c1", "lookup", {"note": HOSTILE}, 1)),
        (200, ev.ToolCallStarted("c1", 1, "k", 1)),
        (300, ev.ToolCallCompleted("c1", {"echo": HOSTILE})),
        (400, ev.ConversationMessage("user", HOSTILE, 1))])
    for args in (("export", "bidi-1"), ("state", "bidi-1", "--json"),
                 ("timeline", "bidi-1", "--json")):
        r = await acli(*args, backend=migrated)
        assert r.exit_code == 0, (args, r.output)
        assert UNSAFE.search(r.stdout) is None, args
        values = ([json.loads(x) for x in r.stdout.splitlines()] if args[0] == "export"
                  else json.loads(r.stdout))
        assert HOSTILE in json.dumps(values, ensure_ascii=False), args  # the value is kept
    line = json.loads((await acli("export", "bidi-1", backend=migrated)).stdout.splitlines()[2])
    assert line["data"]["args"]["note"] == HOSTILE  # escaped on the wire, the same value


@pytest.mark.parametrize("header,loopback", [
    ("127.0.0.1:80@evil.example", False), ("127.0.0.1@evil.example", False),
    ("localhost:8765/x", False), ("127.0.0.1 evil.example", False),
    ("127.0.0.1:8765", True), ("localhost", True), ("[::1]:8765", True), ("[::1]", True),
    ("evil.example:80", False)])
def test_the_host_header_is_read_whole(header, loopback):
    assert is_loopback(_host_of(header)) is loopback


async def test_a_host_with_userinfo_is_refused_over_http(migrated):
    with running_viewer(migrated) as base:
        async with viewer_client(base) as http:
            evil = await http.get("/", headers={"Host": "127.0.0.1:80@evil.example"})
            assert evil.status_code == 403
            assert (await http.get("/", headers={"Host": "127.0.0.1:80"})).status_code == 200


@pytest.mark.parametrize("behind_tls", [False, True])
async def test_the_session_cookie_is_secure_behind_tls(migrated, behind_tls):
    with running_viewer(migrated, token=TOKEN, behind_tls=behind_tls) as base:
        async with viewer_client(base) as http:
            login = await http.get("/", params={"token": TOKEN})
            assert login.status_code == 303
            cookie = login.headers["set-cookie"].lower()
            assert "session_store_viewer=" in cookie and "samesite=strict" in cookie
            assert ("; secure" in cookie) is behind_tls
