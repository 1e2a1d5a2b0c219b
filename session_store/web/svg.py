"""Server-side SVG of a call: swimlanes for a window of events, and an overview in buckets.

Pure string building; every piece of data that reaches the markup goes through `esc`.
Clickable marks carry `data-v` (an event version): the page's script asks the state
inspector for the projection at that version.
"""

from __future__ import annotations

import math
from html import escape
from urllib.parse import urlencode

from ..audit.queries import Overview
from ..audit.fmt import iso
from ..audit.timeline import LANES, Timeline, ToolCallView

WIDTH = 1100
LABEL = 100
LANE_H = 26
TOOL_ROW_H = 12
MAX_TOOL_ROWS = 10
LANE_ORDER = ("speech", "tools", "connection", "settings", "session", "conversation", "errors")

COLORS = {"speech": "#4a90d9", "completed": "#3a9d5d", "failed": "#d0453b",
          "cancelled": "#999999", "waiting": "#e0a030", "running": "#7a5fc0",
          "connection": "#2c7fb8", "settings": "#b8860b", "session": "#555555",
          "takeover": "#d0453b", "conversation": "#888888", "errors": "#d0453b",
          "undelivered": "#e0a030", "tools": "#3a9d5d"}


def esc(value) -> str:
    return escape("" if value is None else str(value), quote=True)


class _Scale:
    def __init__(self, start_us: int, end_us: int):
        self.start, self.span = start_us, max(end_us - start_us, 1)

    def x(self, at_us: int | None, default: float) -> float:
        if at_us is None:
            return default
        frac = min(max((at_us - self.start) / self.span, 0.0), 1.0)
        return round(LABEL + frac * (WIDTH - LABEL - 10), 1)


def _pack(calls: list[ToolCallView], scale: _Scale, left: float, right: float):
    """Greedy interval packing of tool bars into rows (the last row takes the overflow)."""
    row_ends: list[float] = []
    placed = []
    for c in calls:
        x0 = scale.x(c.requested_at_us, left)
        x1 = max(scale.x(c.end_us, right) if c.end_us else right, x0 + 3)
        for i, end in enumerate(row_ends):
            if end + 2 <= x0:
                row_ends[i] = x1
                placed.append((i, x0, x1, c))
                break
        else:
            if len(row_ends) < MAX_TOOL_ROWS:
                row_ends.append(x1)
                placed.append((len(row_ends) - 1, x0, x1, c))
            else:
                placed.append((MAX_TOOL_ROWS - 1, x0, x1, c))
    return placed, max(len(row_ends), 1)


def _tool_color(c: ToolCallView) -> str:
    if c.outcome == "completed":
        return COLORS["completed"] if c.in_model is not False and c.delivered_at_us \
            else COLORS["undelivered"]
    if c.outcome in ("failed", "cancelled"):
        return COLORS[c.outcome]
    return COLORS["running"] if c.started_at_us else COLORS["waiting"]


def lanes_svg(tl: Timeline) -> str:
    """Swimlanes for one window: speech, tool bars, reconnects, settings, takeovers, …"""
    if tl.start_us is None:
        return '<p class="empty">no events</p>'
    scale = _Scale(tl.start_us, tl.end_us)
    left, right = float(LABEL), float(WIDTH - 10)
    calls = sorted(tl.tool_calls.values(),
                   key=lambda c: (c.requested_at_us or tl.start_us, c.call_id))
    placed, tool_rows = _pack(calls, scale, left, right)
    heights = {lane: LANE_H for lane in LANE_ORDER}
    heights["tools"] = max(LANE_H, tool_rows * (TOOL_ROW_H + 2) + 6)
    tops, y = {}, 22
    for lane in LANE_ORDER:
        tops[lane] = y
        y += heights[lane]
    out = [f'<svg class="lanes" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
           f'height="{y + 4}" viewBox="0 0 {WIDTH} {y + 4}" role="img" '
           'aria-label="call timeline swimlanes">']
    out.append(f'<text x="{LABEL}" y="14" class="axis">{esc(iso(tl.start_us))}</text>')
    out.append(f'<text x="{WIDTH - 10}" y="14" class="axis" text-anchor="end">'
               f'{esc(iso(tl.end_us))}</text>')
    for lane in LANE_ORDER:
        top = tops[lane]
        out.append(f'<rect class="lane-bg" x="0" y="{top}" width="{WIDTH}" '
                   f'height="{heights[lane] - 2}" fill="#f4f4f4"/>')
        out.append(f'<text x="6" y="{top + 16}" class="lane-label">{esc(lane)}</text>')
    # speech: one rect per bot turn
    top = tops["speech"]
    for s in tl.speech:
        x0, x1 = scale.x(s.start_us, left), scale.x(s.end_us, right)
        v = s.start_version or s.end_version
        out.append(f'<rect class="ev speech" data-v="{v}" x="{x0}" y="{top + 4}" '
                   f'width="{max(x1 - x0, 2):.1f}" height="{LANE_H - 10}" '
                   f'fill="{COLORS["speech"]}"><title>bot speaking, generation '
                   f'{esc(s.generation)}; {esc(s.duration_ms)} ms; ended by '
                   f'{esc(s.end_source)}</title></rect>')
    # tools: a bar from request to delivery, the run part darker
    top = tops["tools"]
    for row, x0, x1, c in placed:
        ty = top + 3 + row * (TOOL_ROW_H + 2)
        v = c.requested_version or c.finished_version or (c.attempts[0]["version"]
                                                          if c.attempts else tl.first_version)
        tip = (f"{c.call_id} {c.name or ''}: {c.outcome or 'pending'}; waited {c.wait_ms} ms, "
               f"ran {c.run_ms} ms; delivered "
               + (f"via {c.delivered_via} on generation {c.delivered_generation}"
                  if c.delivered_at_us else "not yet"))
        out.append(f'<g class="ev tool" data-v="{v}" data-call="{esc(c.call_id)}">'
                   f'<title>{esc(tip)}</title><rect x="{x0}" y="{ty}" width="{x1 - x0:.1f}" '
                   f'height="{TOOL_ROW_H}" rx="2" fill="{_tool_color(c)}" fill-opacity="0.45"/>')
        if c.started_at_us is not None:
            r0 = scale.x(c.started_at_us, left)
            r1 = scale.x(c.finished_at_us, right) if c.finished_at_us else right
            out.append(f'<rect x="{r0}" y="{ty}" width="{max(r1 - r0, 2):.1f}" '
                       f'height="{TOOL_ROW_H}" fill="{_tool_color(c)}"/>')
        out.append("</g>")
    # point events
    for e in tl.entries:
        mark = _mark(e.type, e.level)
        if mark is None:
            continue
        lane, shape, color = mark
        x, cy = scale.x(e.at_us, left), tops[lane] + LANE_H // 2 - 1
        title = f'<title>v{e.version} {esc(e.summary)}</title>'
        if shape == "line":
            out.append(f'<g class="ev" data-v="{e.version}">{title}<line x1="{x}" x2="{x}" '
                       f'y1="{tops[lane] + 2}" y2="{tops[lane] + LANE_H - 4}" stroke="{color}" '
                       f'stroke-width="3"/></g>')
        elif shape == "diamond":
            out.append(f'<g class="ev" data-v="{e.version}">{title}<path d="M{x} {cy - 6} '
                       f'L{x + 6} {cy} L{x} {cy + 6} L{x - 6} {cy} Z" fill="{color}"/></g>')
        else:
            out.append(f'<g class="ev" data-v="{e.version}">{title}<circle cx="{x}" cy="{cy}" '
                       f'r="{5 if shape == "big" else 3}" fill="{color}"/></g>')
    out.append("</svg>")
    return "".join(out)


def _mark(etype: str, level: str):
    if etype in ("connection.disconnected", "connection.connected"):
        return "connection", "line", COLORS["errors"] if level == "error" else COLORS["connection"]
    if etype in ("connection.handle_issued", "connection.reconnect_requested",
                 "connection.go_away"):
        return "connection", "dot", COLORS["connection"]
    if etype == "settings.changed":
        return "settings", "diamond", COLORS["settings"]
    if etype == "session.worker_attached":
        return "session", "big", COLORS["takeover"]
    if etype in ("session.opened", "session.closed"):
        return "session", "line", COLORS["session"]
    if etype == "conversation.message":
        return "conversation", "dot", COLORS["conversation"]
    if level == "error":
        return "errors", "big", COLORS["errors"]
    return None


def overview_svg(ov: Overview, window: tuple[int, int] | None, link_params: dict) -> str:
    """The whole call in buckets: one heat row per lane; a click jumps to that bucket."""
    buckets = len(ov.first_version)
    bw = (WIDTH - LABEL - 10) / max(buckets, 1)
    rows = [lane for lane in LANES if any(ov.counts[lane])]
    h = 14
    height = 18 + len(rows) * h
    out = [f'<svg class="overview" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
           f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
           'aria-label="whole call overview">']
    if window is not None:
        sc = _Scale(ov.start_us, ov.end_us)
        x0, x1 = sc.x(window[0], LABEL), sc.x(window[1], WIDTH - 10)
        out.append(f'<rect x="{x0}" y="0" width="{max(x1 - x0, 2):.1f}" height="{height}" '
                   'fill="#ffe9a8"/>')
    peak = max((max(ov.counts[lane]) for lane in rows), default=1) or 1
    for r, lane in enumerate(rows):
        y = 16 + r * h
        out.append(f'<text x="6" y="{y + 10}" class="lane-label small">{esc(lane)}</text>')
        for b, n in enumerate(ov.counts[lane]):
            if not n:
                continue
            op = 0.2 + 0.8 * math.log1p(n) / math.log1p(peak)
            v = ov.first_version[b]
            href = "?" + urlencode({**link_params, "from": v})
            out.append(f'<a href="{esc(href)}"><rect x="{LABEL + b * bw:.1f}" y="{y}" '
                       f'width="{max(bw - 0.5, 1):.1f}" height="{h - 3}" '
                       f'fill="{COLORS.get(lane, "#555")}" fill-opacity="{op:.2f}">'
                       f'<title>{n} {esc(lane)} events from version {v}</title></rect></a>')
    out.append(f'<text x="{LABEL}" y="11" class="axis">{esc(iso(ov.start_us))}</text>')
    out.append(f'<text x="{WIDTH - 10}" y="11" class="axis" text-anchor="end">'
               f'{esc(iso(ov.end_us))}</text></svg>')
    return "".join(out)
