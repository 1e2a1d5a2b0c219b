"""The swimlanes' labels (pure: an SVG string from a timeline built in memory): each bar is
named inside itself when it has room, cut to fit otherwise, and never overflows."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from session_store.audit import build_timeline
from session_store.projection import fold
from session_store.web.svg import _label, lanes_svg

from .helpers import chain, support_call

CHAR_PX = 6.2  # what the labels' font takes a character to be (svg.py)


def labels(svg: str) -> dict[str, list[str]]:
    """Label texts by class, from the SVG parsed as XML (so it must be well formed)."""
    out: dict[str, list[str]] = {}
    for node in ET.fromstring(svg).iter():
        if node.tag.endswith("text") and "label" in (node.get("class") or ""):
            out.setdefault(node.get("class"), []).append(node.text)
    return out


@pytest.mark.parametrize("zoom", [1.0, 8.0])
def test_the_support_calls_bars_are_labelled(zoom):
    recs = chain("support-1", support_call())
    tl = build_timeline(recs, call_id="support-1", final_state=fold(recs))
    got = labels(lanes_svg(tl, zoom))
    assert got["bar-label"] == ["lookup_order"]          # the tool call's bar
    assert got["bar-label light"] == ["g1", "g2"]        # the bot's turns, by generation
    assert got["gap-label"] == ["crash: 0.80 s silent"]  # the takeover's silence
    assert got["axis tick-label"][0] == "+0 s" and len(got["axis tick-label"]) >= 5


@pytest.mark.parametrize("width", [10.0, 24.0, 40.0, 90.0, 400.0])
def test_a_label_fits_its_bar_or_is_left_out(width):
    name = "refund_order_for_a_customer_who_called_twice"
    svg = _label(100.0, 100.0 + width, 20, name)
    if not svg:
        assert width < 3 * CHAR_PX + 6
        return
    text = ET.fromstring(svg).text
    assert 3 + len(text) * CHAR_PX <= width  # starts 3 px in, ends inside the bar
    assert text == name or (text.endswith("…") and name.startswith(text[:-1]))
