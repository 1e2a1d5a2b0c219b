"""The web viewer over HTTP (real uvicorn on 127.0.0.1): pages, API, export, token, binding."""

from __future__ import annotations

import html
import json
import re
from urllib.parse import quote

import httpx
import pytest

from session_store import events as ev
from session_store.audit import MASK
from session_store.web import check_bind, is_loopback

from .conftest import running_viewer, viewer_client
from .helpers import SECRET, acli
from .test_hostile_input import HOSTILE, WEIRD_ID

TOKEN = "t0ken-for-tests-1234"
PRIVATE = ("bob@example.com", "Kore", "Where is my order", "has shipped", "Puck")
SECRETS = (SECRET, "tok-SECRET", "hunter2")


async def test_pages_api_and_export(loaded):
    with running_viewer(loaded) as base:
        async with viewer_client(base) as http:
            home = await http.get("/")
            assert home.status_code == 200
            for call in ("support-1", "failing-1", "live-1"):
                assert f'href="/calls/{call}"' in home.text
            assert "3 calls match" in home.text
            assert home.headers["content-security-policy"].startswith("default-src 'none'")
            api = (await http.get("/api/calls", params={"status": "closed"})).json()
            assert [c["call"] for c in api["calls"]] == ["support-1"]
            assert api["calls"][0]["takeovers"] == 1 and api["calls"][0]["reconnects"] == 2

            page = await http.get("/calls/support-1")
            assert page.status_code == 200
            assert '<svg class="lanes"' in page.text and '<svg class="overview"' in page.text
            assert page.text.count('<tr class="ev') >= 25
            assert 'href="/export/support-1?redact=1"' in page.text
            assert not any(s in page.text for s in SECRETS)
            assert "bob@example.com" in page.text  # plain view: only secrets are masked
            red = await http.get("/calls/support-1", params={"redact": "1"})
            assert not any(s in red.text for s in SECRETS + PRIVATE)

            st = (await http.get("/api/state/support-1", params={"at": 7})).json()
            assert st["version"] == 7 and st["event"]["type"] == "tool.call_deferred"
            assert st["deferred"] == ["c1"] and st["bot_speaking"] is True
            assert st["settings"]["api_key"] == MASK
            head = (await http.get("/api/state/support-1", params={"redact": "1"})).json()
            assert head["version"] == 25 and not any(s in json.dumps(head)
                                                     for s in SECRETS + PRIVATE)

            tl = (await http.get("/api/timeline/support-1", params={"from": 10,
                                                                    "n": 5})).json()
            assert [e["version"] for e in tl["entries"]] == [10, 11, 12, 13, 14]

            ex = await http.get("/export/support-1", params={"redact": "1"})
            assert ex.status_code == 200
            assert ex.headers["content-disposition"] == (
                'attachment; filename="support-1.redacted.jsonl"')
            lines = ex.text.splitlines()
            assert len(lines) == 25 and not any(s in ex.text for s in SECRETS + PRIVATE)
            assert json.loads(lines[5])["data"]["args"]["email"] == MASK
            cli = (await acli("export", "support-1", "--redact", backend=loaded)).stdout
            assert cli.splitlines() == lines  # the web and the CLI export the same bytes

            rp = (await http.get("/api/replay/support-1", params={"defer": "none"})).json()
            assert [d["version"] for d in rp["divergences"]] == [6]


async def test_not_found_and_hostile_ids_over_http(loaded):
    with running_viewer(loaded) as base:
        async with viewer_client(base) as http:
            for s in HOSTILE + ["..x", "a/b", "a?b#c"]:
                q = quote(s.encode("utf-8", "surrogatepass"), safe="")
                page = await http.get(f"/calls/{q}")
                assert page.status_code == 404 and "not found" in page.text, s
                for api in ("state", "timeline", "replay", "live"):
                    r = await http.get(f"/api/{api}/{q}")
                    assert r.status_code == 404 and r.json()["error"] == "not found", (s, api)
                assert (await http.get(f"/export/{q}")).status_code == 404
                listing = await http.get(f"/?q={q}")
                assert listing.status_code == 200 and "<script>alert" not in listing.text
                paged = await http.get(f"/?q={q}&after={q}")  # no such call: not an empty page
                assert paged.status_code == 400 and "<script>alert" not in paged.text, repr(s)
                assert (await http.get(f"/api/calls?after={q}")).status_code == 400
                assert (await http.get(f"/api/calls?since={q}")).status_code == 400
                assert (await http.get(f"/?status={q}")).status_code == 400
            bad = await http.get("/api/state/support-1", params={"at": "1; DROP"})
            assert bad.status_code == 400
            assert (await http.get("/api/calls", params={"status": "closed"})).json()["calls"]


async def test_a_call_with_a_hostile_id_in_the_browser_urls(loaded):
    from .helpers import support_call, write_call

    await write_call(loaded, WEIRD_ID, support_call()[:3])
    with running_viewer(loaded) as base:
        async with viewer_client(base) as http:
            page = await http.get(f"/calls/{quote(WEIRD_ID, safe='')}")
            assert page.status_code == 200
            assert "we&#39;ird &#34;id&#34; [red]%_😀 --" in page.text  # escaped, verbatim
            home = await http.get("/")
            assert f'href="/calls/{quote(WEIRD_ID, safe="")}"' in home.text


async def test_token_is_required_on_every_request(loaded):
    with running_viewer(loaded, token=TOKEN) as base:
        async with viewer_client(base) as http:
            for path in ("/", "/api/calls", "/calls/support-1", "/static/app.js",
                         "/api/state/support-1?at=3", "/export/support-1", "/fleet",
                         "/api/stats", "/api/live/support-1"):
                r = await http.get(path)
                assert r.status_code == 401, path
                assert SECRET not in r.text and "support-1" not in r.text
                wrong = await http.get(path, headers={"Authorization": "Bearer nope"})
                assert wrong.status_code == 401
                ok = await http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
                assert ok.status_code == 200, path
            assert (await http.get("/", params={"token": "nope"})).status_code == 401
            assert (await http.get("/", cookies={"session_store_viewer": TOKEN})).status_code == 401
        async with viewer_client(base) as browser_like:
            login = await browser_like.get("/calls/support-1", params={"token": TOKEN, "n": 50})
            assert login.status_code == 303
            assert login.headers["location"] == "/calls/support-1?n=50"  # token leaves the URL
            cookie = login.headers["set-cookie"].lower()
            assert "httponly" in cookie and "samesite=strict" in cookie
            assert f"max-age={8 * 3600}" in cookie  # a session that expires
            after = await browser_like.get(login.headers["location"])
            assert after.status_code == 200 and "support-1" in after.text
            assert (await browser_like.get("/api/calls")).status_code == 200
        async with viewer_client(base) as http:
            raw = f"//attacker.example/x?token={TOKEN}".encode()
            sneaky = await http.get(httpx.URL(base).copy_with(raw_path=raw))
            assert sneaky.status_code == 303
            assert sneaky.headers["location"] == "/attacker.example/x"  # stays on this site


async def test_without_a_token_only_loopback_host_names_are_answered(loaded):
    with running_viewer(loaded) as base:
        async with viewer_client(base) as http:
            assert (await http.get("/", headers={"Host": "localhost:1"})).status_code == 200
            rebound = await http.get("/", headers={"Host": "attacker.example"})
            assert rebound.status_code == 403


def test_binding_rule():
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(host)
        check_bind(host, None)
    for host in ("0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.com", ""):
        assert not is_loopback(host)
        with pytest.raises(ValueError, match="needs --token"):
            check_bind(host, None)
        check_bind(host, TOKEN)


def test_serve_refuses_a_public_address_without_a_token(tmp_path):
    from .helpers import cli

    r = cli("serve", "--host", "0.0.0.0", "--db", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    assert r.exit_code == 2 and "refusing to bind to 0.0.0.0" in r.stderr


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_serve_refuses_a_port_that_is_no_port(tmp_path, port):
    """Bad input before anything starts (it was uvicorn's OverflowError traceback, exit 1)."""
    from typer.testing import CliRunner

    from session_store.commands.cli import app

    db = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    assert CliRunner().invoke(app, ["migrate", "--db", db]).exit_code == 0
    r = CliRunner().invoke(app, ["serve", "--port", port, "--db", db])
    assert r.exit_code == 2 and "--port" in r.output, (r.exit_code, r.output, r.exception)


async def test_routes_name_one_call_whatever_its_id(migrated):
    """The call `a/b/export.jsonl` linked to the export of call `a/b`: every route now ends
    with the id, so an id with slashes, route words or dots names exactly one call."""
    from .helpers import support_call, write_call

    ids = ["a/b", "a/b/export.jsonl", "a/b/state", "/lead", "trail/", ".", "..", "a%2Fb",
           "x?y#z"]
    for i, call in enumerate(ids):
        await write_call(migrated, call, support_call()[:3 + i])
    with running_viewer(migrated) as base:
        async with viewer_client(base) as http:
            home = (await http.get("/", params={"limit": 50})).text
            for i, call in enumerate(ids):
                href = re.search(r'class="call-link" href="([^"]+)">'
                                 + re.escape(html.escape(call)) + "<", home).group(1)
                page = await http.get(html.unescape(href))
                assert page.status_code == 200, (call, href)
                assert f"{3 + i} events" in page.text, (call, href)
                export = re.search(r'id="export-link" href="([^"]+)"', page.text).group(1)
                lines = (await http.get(html.unescape(export))).text.splitlines()
                assert len(lines) == 3 + i and {json.loads(x)["call"] for x in lines} == {call}
                state = re.search(r'data-state-url="([^"]+)"', page.text).group(1)
                st = (await http.get(html.unescape(state))).json()
                assert (st["call"], st["version"]) == (call, 3 + i)
                assert (await http.get(href_of("api/timeline", call))).json()["call"] == call


def href_of(kind: str, call: str) -> str:
    from session_store.web.params import href

    return href(kind, call)


async def test_every_answer_carries_the_security_headers(loaded):
    """A 404 from the router (and the gate's 401, a bad request, a static file) carries the
    same security headers as the pages."""
    from session_store.web.security import SECURITY_HEADERS

    with running_viewer(loaded) as base:
        async with viewer_client(base) as http:
            for path, status in (("/no/such/page", 404), ("/static/nope.js", 404),
                                 ("/api/nothing", 404), ("/calls/nope", 404),
                                 ("/?status=weird", 400), ("/static/app.js", 200),
                                 ("/fleet", 200)):
                r = await http.get(path)
                assert r.status_code == status, path
                for k, v in SECURITY_HEADERS.items():
                    if k != "cache-control" or path != "/static/app.js":
                        assert r.headers.get(k) == v, (path, k)
            assert "not found" in (await http.get("/no/such/page")).text
    with running_viewer(loaded, token=TOKEN) as base:
        async with viewer_client(base) as http:
            r = await http.get("/")
            assert r.status_code == 401
            assert r.headers["content-security-policy"] == SECURITY_HEADERS[
                "content-security-policy"]


def test_a_short_token_is_refused():
    from .helpers import cli

    with pytest.raises(ValueError, match="at least 16"):
        check_bind("0.0.0.0", "short-token-15c")
    check_bind("0.0.0.0", "a-token-of-16-ch")
    r = cli("serve", "--token", "hunter2", "--db", "sqlite+aiosqlite:///x.db")
    assert r.exit_code == 2 and "at least 16" in r.stderr


async def test_the_session_cookie_is_signed_and_expires(loaded):
    """`?token=` once gives a signed session cookie (not a hash of the token) that stops
    working when it expires; a cookie made up by hand never works."""
    import base64
    import time

    import itsdangerous

    secret = "a-secret-for-this-test-only"

    def session_cookie(signed_at: float) -> str:
        class Then(itsdangerous.TimestampSigner):
            def get_timestamp(self) -> int:
                return int(signed_at)

        data = base64.b64encode(json.dumps({"signed_in": True}).encode())
        return Then(secret).sign(data).decode()

    with running_viewer(loaded, token=TOKEN, session_max_age_s=600,
                        session_secret=secret) as base:
        async with viewer_client(base) as http:
            login = await http.get("/", params={"token": TOKEN})
            assert login.status_code == 303
            cookie = http.cookies.get("session_store_viewer")
            assert cookie and TOKEN not in cookie and "." in cookie  # signed, not the token
            assert (await http.get("/")).status_code == 200
        async with viewer_client(base) as http:
            fresh = await http.get("/", cookies={"session_store_viewer":
                                                 session_cookie(time.time() - 60)})
            assert fresh.status_code == 200
            old = await http.get("/", cookies={"session_store_viewer":
                                               session_cookie(time.time() - 601)})
            assert old.status_code == 401, "an expired session still works"
            forged = await http.get("/", cookies={"session_store_viewer": cookie[:-2] + "xx"})
            assert forged.status_code == 401


async def test_an_open_call_streams_its_new_events(loaded):
    """GET /api/live/CALL: server-sent events from the store's subscribe, one per new event
    in the timeline's words; the stream ends when the call closes."""
    import asyncio

    store = await loaded.open()
    try:
        with running_viewer(loaded) as base:
            async with viewer_client(base, timeout=20) as http:
                async with http.stream("GET", "/api/live/live-1") as stream:
                    lines = stream.aiter_lines()

                    async def next_update():
                        async for line in lines:
                            if line.startswith("data:"):
                                return json.loads(line[5:])

                    first = await next_update()
                    assert (first["head"], first["status"], first["entries"]) == (2, "open", [])
                    await store.append("live-1", [ev.ToolCallRequested("c1", "lookup_order",
                                                                       {"order_id": 7}, 1)], 2)
                    update = await asyncio.wait_for(next_update(), 10)
                    assert update["head"] == 3
                    assert update["entries"][0]["summary"] == (
                        'c1: lookup_order({"order_id": 7}) requested on generation 1')
                    await store.append("live-1", [ev.SessionClosed("ended")], 3)
                    last = await asyncio.wait_for(next_update(), 10)
                    assert last["status"] == "closed"
                    assert await asyncio.wait_for(next_update(), 10) is None  # it ended
            page = (await http_get(base, "/calls/live-1")).text
            assert "c1: lookup_order" in page
    finally:
        await store.close()


async def http_get(base: str, path: str):
    async with viewer_client(base) as http:
        return await http.get(path)


async def test_a_ten_megabyte_event_costs_the_viewer_what_it_shows(migrated):
    """A 10 MB transcript and a 10 MB argument: the call page carries previews; the timeline
    API and the state inspector cut every string (previews, INSPECTOR_STRING_MAX) unless
    asked for the whole (?full=1); the export keeps it whole."""
    from session_store.web.call_pages import INSPECTOR_STRING_MAX

    from .helpers import ten_megabyte_call, write_call

    await write_call(migrated, "big-1", ten_megabyte_call())
    with running_viewer(migrated) as base:
        async with viewer_client(base, timeout=60) as http:
            page = await http.get(href_of("calls", "big-1"))
            assert page.status_code == 200 and "5 events" in page.text
            assert len(page.text) < 200_000
            timeline = await http.get(href_of("api/timeline", "big-1"))
            assert timeline.status_code == 200 and len(timeline.text) < 50_000
            whole = await http.get(href_of("api/timeline", "big-1"), params={"full": "1"})
            assert len(whole.text) > 20_000_000
            for version in (3, 4):
                state = await http.get(href_of("api/state", "big-1"), params={"at": version})
                assert state.status_code == 200 and len(state.text) < 50_000, version
                longest = max(len(s) for s in _strings(state.json()))
                assert INSPECTOR_STRING_MAX < longest < INSPECTOR_STRING_MAX + 100, version
                whole = await http.get(href_of("api/state", "big-1"),
                                       params={"at": version, "full": "1"})
                assert max(len(s) for s in _strings(whole.json())) == 10_000_000, version
            export = await http.get(href_of("export", "big-1"))
            assert len(export.text) > 20_000_000


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


async def test_a_big_call_page_is_read_a_chunk_at_a_time(migrated, monkeypatch):
    """The page and the timeline API of a call of 3 MB messages: every read of the log the
    viewer makes returns about a chunk (reading.CHUNK_BYTES) or one event, never the window
    at once (the page read its 500-event window whole: here 18 MB); the page is right."""
    from session_store.audit.queries import reading
    from session_store.storage.reads import LogReads

    from .helpers import write_call
    from .test_big_calls import MB, big_call

    await write_call(migrated, "big", big_call(6, 3 * MB))
    held: list[int] = []
    real_read = LogReads.read

    async def read(self, *args, **kwargs):
        recs = await real_read(self, *args, **kwargs)
        held.append(sum(len(r.data_json) for r in recs))
        return recs

    monkeypatch.setattr(LogReads, "read", read)
    with running_viewer(migrated) as base:
        async with viewer_client(base, timeout=60) as http:
            page = await http.get(href_of("calls", "big"))
            assert page.status_code == 200 and "9 events" in page.text, page.text[:2000]
            assert "5xxxxxxxxx" in page.text and len(page.text) < 200_000
            timeline = await http.get(href_of("api/timeline", "big"))
            assert timeline.status_code == 200
            texts = [e["summary"] for e in timeline.json()["entries"]]
            assert len(texts) == 9 and texts[7].startswith("user: 5xxxx"), texts
    assert held and max(held) <= reading.CHUNK_BYTES + 3 * MB + 100, [n // MB for n in held]
