"""The viewer in real headless Chromium (Debian's package at /usr/bin/chromium, driven by
Playwright): list → search → call → swimlanes → click an event → state shown; token enforced;
an open call updating live; deep links; the crash on the swimlanes; the fleet page.
Screenshots go to test-artifacts/tools/ (ignored by git); with SESSION_STORE_DOCS_SCREENSHOTS=1
those of the call page and the fleet page also to docs/ (docs/workbench.md shows them; not on
every run: the fleet page shows today's date)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from session_store import events as ev

from .conftest import running_viewer
from .helpers import SECRET

DOCS = Path(__file__).resolve().parents[2] / "docs"
TO_DOCS = os.environ.get("SESSION_STORE_DOCS_SCREENSHOTS") == "1"

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
TOKEN = "browser-t0ken-5678"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium: apt-get install -y chromium")


async def test_list_call_event_state_in_chromium(loaded, artifacts):
    from playwright.async_api import async_playwright, expect

    def shot(page, name):
        return page.screenshot(path=str(artifacts / f"{loaded.name}-{name}.png"), full_page=True)

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
                assert "deferred: c1" in state_text and "bot speaking\tyes" in state_text
                assert await page.get_attribute("#v7", "class") == "ev info selected"
                await shot(page, "04-state-v7")

                # click a mark in the lanes: the takeover
                await lanes.locator('g.ev[data-v="23"]').click()
                # (a locator assertion: the page's CSP forbids evaluating strings)
                await expect(page.locator("#state-version")).to_have_text("after version 23")
                state_text = await page.inner_text("#state-body")
                assert "w2" in state_text and "connected\tno" in state_text
                await shot(page, "05-state-takeover")

                # the redacted export downloads without secrets or personal data
                async with page.expect_download() as info:
                    await page.click("#export-redacted-link")
                download = await info.value
                body = Path(await download.path()).read_text()
                assert len(body.splitlines()) == 25
                for gone in (SECRET, "hunter2", "bob@example.com", "Kore"):
                    assert gone not in body
                assert json.loads(body.splitlines()[0])["type"] == "session.opened"

                # the redacted view
                await page.click("text=redact this view")
                await page.wait_for_url("**redact=1*")
                assert "bob@example.com" not in await page.content()
                await shot(page, "06-redacted")
            finally:
                await browser.close()


async def test_live_updates_deep_links_crash_and_fleet_in_chromium(loaded, artifacts):
    from playwright.async_api import async_playwright, expect

    store = await loaded.open()
    try:
        with running_viewer(loaded) as base:
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
                try:
                    page = await browser.new_page(viewport={"width": 1500, "height": 1000})
                    await _live(page, base, store, expect)
                    await _deep_links(page, base, expect)
                    await _crash(page, base, expect, artifacts, loaded.name)
                    await _fleet_and_search(page, base, expect, artifacts, loaded.name)
                finally:
                    await browser.close()
    finally:
        await store.close()


async def _live(page, base, store, expect):
    """An open call's page shows a new event within 2 s, without a reload, and counts the
    silence since the last one."""
    await page.goto(base + "/calls/live-1")
    await expect(page.locator("body")).to_have_attribute("data-live", "connected")
    await expect(page.locator("#silence")).to_contain_text("no event for")
    await store.append("live-1", [ev.ToolCallRequested("c7", "lookup_order", {"order_id": 7},
                                                       1)], 2)
    await expect(page.locator("#v3")).to_contain_text("c7: lookup_order", timeout=2000)
    await expect(page.locator("#tool-calls")).to_contain_text("c7", timeout=2000)
    # the whole-call overview follows too: a tools row for the new call (none at load)
    await expect(page.locator("svg.overview")).to_contain_text("tools", timeout=2000)
    await store.append("live-1", [ev.SessionClosed("ended")], 3)
    await expect(page.locator("#call-status")).to_have_text("closed", timeout=2000)
    await expect(page.locator("#v4")).to_contain_text("session closed", timeout=2000)


async def _deep_links(page, base, expect):
    """?at=V and #vV select an event (and show its state); a click puts it in the URL."""
    await page.goto(base + "/calls/support-1?at=20")
    await expect(page.locator("#v20")).to_have_class("ev info selected")
    await expect(page.locator("#state-version")).to_have_text("after version 20")
    await page.goto(base + "/calls/support-1#v7")
    await expect(page.locator("#state-version")).to_have_text("after version 7")
    await expect(page.locator("#v7")).to_have_class("ev info selected")
    await page.click("#v12")
    await expect(page.locator("#state-version")).to_have_text("after version 12")
    assert page.url.endswith("/calls/support-1?at=12"), page.url
    # a version outside the window on screen: the page holding it
    await page.goto(base + "/calls/support-1?n=5#v20")
    await page.wait_for_url("**at=20*")
    await expect(page.locator("#v20")).to_have_class("ev info selected")
    assert await page.locator("#entries tbody tr").count() == 5
    await expect(page.locator("#pager")).to_contain_text("events 16–20 of 25")


async def _crash(page, base, expect, artifacts, name):
    """The dead worker's last event, the silence and the takeover, on the lanes and in the
    table."""
    await page.goto(base + "/calls/support-1?at=23")
    lanes = page.locator("svg.lanes")
    gap = lanes.locator("g.gap.crash")
    assert await gap.count() == 1
    assert "silent for 0.80 s" in await gap.locator("title").text_content()
    assert await lanes.locator('g.last-of-worker[data-v="22"]').count() == 1
    assert await lanes.locator("text.tick-label").count() >= 4  # a time axis
    await expect(page.locator("#v22")).to_have_class("ev info last-of-worker")
    await expect(page.locator("#v23")).to_contain_text("crash")
    await expect(page.locator("#takeovers")).to_contain_text("0.80 s of silence")
    await page.click("#zoom-in")
    await page.wait_for_url("**zoom=2*")
    assert await page.locator("svg.lanes").get_attribute("width") == "2200"
    await page.goto(base + "/calls/support-1?at=23")
    for path in [artifacts / f"{name}-07-crash.png"] + ([DOCS / "workbench-call.png"]
                                                         if TO_DOCS else []):
        await page.screenshot(path=str(path), full_page=True)


async def _fleet_and_search(page, base, expect, artifacts, name):
    await page.goto(base + "/")
    await page.fill("input[name=text]", "where is my ORDER")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url("**text=where*")
    rows = page.locator("#calls tbody tr.call-row")
    assert await rows.count() == 1
    await expect(rows).to_contain_text("support-1")
    await page.click("#nav-fleet")
    await page.fill("input[name=since]", "3000d")
    await page.click("form.filters button[type=submit]")
    await expect(page.locator("#card-calls .big")).to_have_text("3")
    await expect(page.locator("#card-crashes .big")).to_have_text("1")
    await expect(page.locator("#card-anomalies .big")).to_have_text("1")
    await expect(page.locator("#lat-tool_wait_ms")).to_contain_text("1120 ms")
    assert await page.locator("svg.per-hour rect.hour-bar").count() >= 2
    for path in [artifacts / f"{name}-08-fleet.png"] + ([DOCS / "workbench-fleet.png"]
                                                         if TO_DOCS else []):
        await page.screenshot(path=str(path), full_page=True)
