"""The web viewer over HTTP (real uvicorn on 127.0.0.1): pages, API, export, token, binding."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest

from session_store.audit import MASK
from session_store.web import check_bind, is_loopback

from .conftest import running_viewer
from .helpers import SECRET, acli
from .test_hostile_input import HOSTILE, WEIRD_ID

TOKEN = "t0ken-for-tests-1234"
PRIVATE = ("bob@example.com", "Be brief.", "Where is my order", "has shipped", "Puck")
SECRETS = (SECRET, "tok-SECRET", "hunter2")


async def test_pages_api_and_export(loaded):
    with running_viewer(loaded) as base:
        async with httpx.AsyncClient(base_url=base) as http:
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
            assert 'href="/calls/support-1/export.jsonl?redact=1"' in page.text
            assert not any(s in page.text for s in SECRETS)
            assert "bob@example.com" in page.text  # plain view: only secrets are masked
            red = await http.get("/calls/support-1", params={"redact": "1"})
            assert not any(s in red.text for s in SECRETS + PRIVATE)

            st = (await http.get("/api/calls/support-1/state", params={"at": 7})).json()
            assert st["at"] == 7 and st["event"]["type"] == "tool.call_deferred"
            assert st["state"]["deferred"] == ["c1"] and st["state"]["bot_speaking"] is True
            assert st["state"]["settings"]["api_key"] == MASK
            head = (await http.get("/api/calls/support-1/state",
                                   params={"redact": "1"})).json()
            assert head["at"] == 25 and not any(s in json.dumps(head)
                                                for s in SECRETS + PRIVATE)

            tl = (await http.get("/api/calls/support-1/timeline", params={"from": 10,
                                                                          "n": 5})).json()
            assert [e["version"] for e in tl["timeline"]["entries"]] == [10, 11, 12, 13, 14]

            ex = await http.get("/calls/support-1/export.jsonl", params={"redact": "1"})
            assert ex.status_code == 200
            assert ex.headers["content-disposition"] == (
                'attachment; filename="support-1.redacted.jsonl"')
            lines = ex.text.splitlines()
            assert len(lines) == 25 and not any(s in ex.text for s in SECRETS + PRIVATE)
            assert json.loads(lines[5])["data"]["args"]["email"] == MASK
            cli = (await acli("export", "support-1", "--redact", backend=loaded)).stdout
            assert cli.splitlines() == lines  # the web and the CLI export the same bytes

            rp = (await http.get("/api/calls/support-1/replay", params={"defer": "none"})).json()
            assert [d["version"] for d in rp["divergences"]] == [6]


async def test_not_found_and_hostile_ids_over_http(loaded):
    with running_viewer(loaded) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            for s in HOSTILE + ["..x", "a/b", "a?b#c"]:
                q = quote(s.encode("utf-8", "surrogatepass"), safe="")
                page = await http.get(f"/calls/{q}")
                assert page.status_code == 404 and "not found" in page.text, s
                for api in ("state", "timeline", "replay"):
                    r = await http.get(f"/api/calls/{q}/{api}")
                    assert r.status_code == 404 and r.json()["error"] == "not found", (s, api)
                assert (await http.get(f"/calls/{q}/export.jsonl")).status_code == 404
                listing = await http.get(f"/?q={q}")
                assert listing.status_code == 200 and "<script>alert" not in listing.text
                paged = await http.get(f"/?q={q}&after={q}")  # no such call: not an empty page
                assert paged.status_code == 400 and "<script>alert" not in paged.text, repr(s)
                assert (await http.get(f"/api/calls?after={q}")).status_code == 400
                assert (await http.get(f"/api/calls?since={q}")).status_code == 400
                assert (await http.get(f"/?status={q}")).status_code == 400
            bad = await http.get("/api/calls/support-1/state", params={"at": "1; DROP"})
            assert bad.status_code == 400
            assert (await http.get("/api/calls", params={"status": "closed"})).json()["calls"]


async def test_a_call_with_a_hostile_id_in_the_browser_urls(loaded):
    from .helpers import support_call, write_call

    await write_call(loaded, WEIRD_ID, support_call()[:3])
    with running_viewer(loaded) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            page = await http.get(f"/calls/{quote(WEIRD_ID, safe='')}")
            assert page.status_code == 200
            assert "we&#39;ird &#34;id&#34; [red]%_😀 --" in page.text  # escaped, verbatim
            home = await http.get("/")
            assert f'href="/calls/{quote(WEIRD_ID, safe="")}"' in home.text


async def test_token_is_required_on_every_request(loaded):
    with running_viewer(loaded, token=TOKEN) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            for path in ("/", "/api/calls", "/calls/support-1", "/static/app.js",
                         "/api/calls/support-1/state?at=3", "/calls/support-1/export.jsonl"):
                r = await http.get(path)
                assert r.status_code == 401, path
                assert SECRET not in r.text and "support-1" not in r.text
                wrong = await http.get(path, headers={"Authorization": "Bearer nope"})
                assert wrong.status_code == 401
                ok = await http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
                assert ok.status_code == 200, path
            assert (await http.get("/", params={"token": "nope"})).status_code == 401
            assert (await http.get("/", cookies={"session_store_viewer": TOKEN})).status_code == 401
        async with httpx.AsyncClient(base_url=base) as browser_like:
            login = await browser_like.get("/calls/support-1", params={"token": TOKEN, "n": 50})
            assert login.status_code == 303
            assert login.headers["location"] == "/calls/support-1?n=50"  # token leaves the URL
            assert "HttpOnly" in login.headers["set-cookie"]
            after = await browser_like.get(login.headers["location"])
            assert after.status_code == 200 and "support-1" in after.text
            assert (await browser_like.get("/api/calls")).status_code == 200
        async with httpx.AsyncClient(base_url=base) as http:
            raw = f"//attacker.example/x?token={TOKEN}".encode()
            sneaky = await http.get(httpx.URL(base).copy_with(raw_path=raw))
            assert sneaky.status_code == 303
            assert sneaky.headers["location"] == "/attacker.example/x"  # stays on this site


async def test_without_a_token_only_loopback_host_names_are_answered(loaded):
    with running_viewer(loaded) as base:
        async with httpx.AsyncClient(base_url=base) as http:
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

    from session_store.cli import app

    db = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    assert CliRunner().invoke(app, ["migrate", "--db", db]).exit_code == 0
    r = CliRunner().invoke(app, ["serve", "--port", port, "--db", db])
    assert r.exit_code == 2 and "--port" in r.output, (r.exit_code, r.output, r.exception)
