"""The viewer in real headless Chromium (Debian's package at /usr/bin/chromium, driven by
Playwright): list → search → call → swimlanes → click an event → state shown; token enforced.
Screenshots go to test-artifacts/tools/ (ignored by git)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import running_viewer
from .helpers import SECRET

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
TOKEN = "browser-t0ken-5678"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium: apt-get install -y chromium")


async def test_list_call_event_state_in_chromium(loaded, artifacts):
    from playwright.async_api import async_playwright, expect

    shot = lambda page, name: page.screenshot(  # noqa: E731
        path=str(artifacts / f"{loaded.name}-{name}.png"), full_page=True)
    with running_viewer(loaded, token=TOKEN) as base:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1500, "height": 1000},
                                              accept_downloads=True)
                # no token: nothing but a 401
                response = await page.goto(base + "/")
                assert response.status == 401
                assert "support-1" not in await page.content()
                await shot(page, "01-unauthorized")

                # the token once in the URL: a cookie, and the URL loses the token
                await page.goto(base + f"/?token={TOKEN}")
                assert page.url == base + "/"
                rows = page.locator("#calls tbody tr.call-row")
                assert await rows.count() == 3
                await shot(page, "02-calls")

                await page.fill("input[name=q]", "support")
                await page.click("form.filters button[type=submit]")
                await page.wait_for_url("**/?q=support*")
                assert await rows.count() == 1
                await page.click("a.call-link")
                await page.wait_for_url("**/calls/support-1")
                assert "support-1" in await page.locator("#call-title").inner_text()

                # the swimlanes: every lane, two speech turns, the tool call's bar
                lanes = page.locator("svg.lanes")
                labels = await lanes.locator("text.lane-label").all_text_contents()
                assert labels == ["speech", "tools", "connection", "settings", "session",
                                  "conversation", "errors"]
                assert await lanes.locator("rect.speech").count() == 2
                assert await lanes.locator('g.tool[data-call="c1"]').count() == 1
                assert await lanes.locator("g.ev").count() >= 10
                await shot(page, "03-timeline")

                # click an event row: the state right after it
                await page.click("#v7")
                await expect(page.locator("#state-version")).to_have_text("after version 7")
                state_text = await page.inner_text("#state-body")
                assert "deferred: c1" in state_text and "bot speaking\ttrue" in state_text
                assert await page.get_attribute("#v7", "class") == "ev info selected"
                await shot(page, "04-state-v7")

                # click a mark in the lanes: the takeover
                await lanes.locator('g.ev[data-v="23"]').click()
                # (a locator assertion: the page's CSP forbids evaluating strings)
                await expect(page.locator("#state-version")).to_have_text("after version 23")
                state_text = await page.inner_text("#state-body")
                assert "w2" in state_text and "connected\tfalse" in state_text
                await shot(page, "05-state-takeover")

                # the redacted export downloads without secrets or personal data
                async with page.expect_download() as info:
                    await page.click("#export-redacted-link")
                download = await info.value
                body = Path(await download.path()).read_text()
                assert len(body.splitlines()) == 25
                for gone in (SECRET, "hunter2", "bob@example.com", "Be brief."):
                    assert gone not in body
                assert json.loads(body.splitlines()[0])["type"] == "session.opened"

                # the redacted view
                await page.click("text=redact this view")
                await page.wait_for_url("**redact=1*")
                assert "bob@example.com" not in await page.content()
                await shot(page, "06-redacted")
            finally:
                await browser.close()
