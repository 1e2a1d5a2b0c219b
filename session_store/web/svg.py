"""Server-side SVG of a call: swimlanes for a window of events, an overview in buckets, and
the fleet's calls per hour.

Pure string building; every piece of data that reaches the markup goes through `esc`.
Clickable marks carry `data-v` (an event version): the page's script shows the state at that
version and puts it in the URL. Why hand-written SVG and not a charting library: see
docs/workbench.md ("Swimlanes").
"""

from __future__ import annotations

import math
from html import escape

from ..audit.fmt import clip, iso
from ..audit.queries import Overview
from ..audit.timeline import KINDS, LANES, Timeline, ToolCallView, lane_of

WIDTH = 1100
LABEL = 100
AXIS_H = 30
LANE_H = 26
TOOL_ROW_H = 14
MAX_TOOL_ROWS = 10
LANE_ORDER = ("speech", "tools", "connection", "settings", "session", "conversation", "other",
              "errors")

COLORS = {"speech": "#4a90d9", "completed": "#3a9d5d", "failed": "#d0453b",
          "cancelled": "#999999", "waiting": "#e0a030", "running": "#7a5fc0",
          "connection": "#2c7fb8", "settings": "#b8860b", "session": "#555555",
          "takeover": "#d0453b", "planned": "#2c7fb8", "conversation": "#888888",
          "errors": "#d0453b", "not_sent": "#e0a030", "tools": "#3a9d5d", "other": "#6a6a9a"}


def esc(value) -> str:
    return escape("" if value is None else str(value), quote=True)


class _Scale:
    def __init__(self, start_us: int, end_us: int, width: int = WIDTH):
        self.start, self.span, self.width = start_us, max(end_us - start_us, 1), width

    def x(self, at_us: int | None, default: float) -> float:
        if at_us is None:
            return default
        frac = min(max((at_us - self.start) / self.span, 0.0), 1.0)
        return round(LABEL + frac * (self.width - LABEL - 10), 1)


def nice_step(span_us: int, target: int = 8) -> int:
    """A tick step of 1, 2 or 5 × 10^k µs giving about `target` ticks over the span."""
    raw = max(span_us / target, 1)
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            return int(m * power)
    return int(10 * power)


def _offset(us: int) -> str:
    s = us / 1e6
    if abs(s) < 10:
        return f"+{s:.3f}".rstrip("0").rstrip(".") + " s"
    if abs(s) < 600:
        return f"+{s:.1f} s"
    return f"+{s / 60:.1f} min"


def _axis(scale: _Scale, t0_us: int, top: int, height: int) -> list[str]:
    """Ticks every `nice_step`, labelled with the time since the call began."""
    step = nice_step(scale.span, target=max(4, scale.width // 130))
    first = -(-(scale.start - t0_us) // step) * step + t0_us
    out = []
    t = first
    while t <= scale.start + scale.span:
        x = scale.x(t, LABEL)
        out.append(f'<line class="tick" x1="{x}" x2="{x}" y1="{top - 6}" y2="{top + height}" '
                   'stroke="#ddd"/>')
        out.append(f'<text class="axis tick-label" x="{x}" y="{top - 9}" '
                   f'text-anchor="middle">{esc(_offset(t - t0_us))}</text>')
        t += step
    return out


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
        return COLORS["completed"] if c.in_model is not False and c.sent_at_us \
            else COLORS["not_sent"]
    if c.outcome in ("failed", "cancelled"):
        return COLORS[c.outcome]
    return COLORS["running"] if c.started_at_us else COLORS["waiting"]


def _label(x0: float, x1: float, y: float, text: str, cls: str = "bar-label") -> str:
    """A label inside a bar when the bar has room for it (cut to fit, never overflowing)."""
    room = int((x1 - x0 - 6) / 6.2)
    if room < 3:
        return ""
    return (f'<text class="{cls}" x="{x0 + 3:.1f}" y="{y}" '
            f'pointer-events="none">{esc(clip(text, room))}</text>')


def lanes_svg(tl: Timeline, zoom: float = 1.0) -> str:
    """Swimlanes for one window: a time axis, speech, tool bars, reconnects, settings,
    takeovers with the silence before them, … `zoom` widens the drawing (the page scrolls)."""
    if tl.start_us is None or tl.end_us is None:
        return '<p class="empty">no events</p>'
    width = int(WIDTH * max(1.0, min(zoom, 64.0)))
    scale = _Scale(tl.start_us, tl.end_us, width)
    left, right = float(LABEL), float(width - 10)
    calls = sorted(tl.tool_calls.values(),
                   key=lambda c: (c.requested_at_us or tl.start_us, c.tool_call_id))
    placed, tool_rows = _pack(calls, scale, left, right)
    lanes = [lane for lane in LANE_ORDER
             if lane not in ("other",) or any(e.lane == lane for e in tl.entries)]
    heights = {lane: LANE_H for lane in lanes}
    heights["tools"] = max(LANE_H, tool_rows * (TOOL_ROW_H + 2) + 6)
    tops, y = {}, AXIS_H
    for lane in lanes:
        tops[lane] = y
        y += heights[lane]
    out = [f'<svg class="lanes" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{y + 4}" viewBox="0 0 {width} {y + 4}" role="img" '
           'aria-label="call timeline swimlanes">']
    for lane in lanes:
        top = tops[lane]
        out.append(f'<rect class="lane-bg" x="0" y="{top}" width="{width}" '
                   f'height="{heights[lane] - 2}" fill="#f4f4f4"/>')
        out.append(f'<text x="6" y="{top + 16}" class="lane-label">{esc(lane)}</text>')
    out += _axis(scale, tl.t0_us, AXIS_H, y - AXIS_H)
    # takeovers: the silence before each, and the old worker's last event
    for t in tl.takeovers:
        if t.last_event_at_us is None:
            continue
        x0, x1 = scale.x(t.last_event_at_us, left), scale.x(t.at_us, right)
        color = COLORS["takeover"] if t.kind == "crash" else COLORS["planned"]
        silent = f"{t.silent_ms / 1000:.2f} s" if t.silent_ms is not None else ""
        out.append(f'<g class="gap {esc(t.kind)}" data-v="{t.version}"><title>'
                   f'{esc(t.kind)}: worker {esc(t.previous_worker)} silent for {esc(silent)} '
                   f'after v{t.last_event_version}, then worker {esc(t.worker)} took over at '
                   f'v{t.version}</title><rect x="{x0}" y="{AXIS_H}" '
                   f'width="{max(x1 - x0, 2):.1f}" height="{y - AXIS_H}" fill="{color}" '
                   f'fill-opacity="0.12" stroke="{color}" stroke-dasharray="4 3"/>'
                   + _label(x0, x1, AXIS_H + 12,
                            f"{'crash' if t.kind == 'crash' else 'hand-over'}: {silent} silent",
                            "gap-label") + "</g>")
        if t.last_event_version is not None and "session" in tops:
            cy = tops["session"] + LANE_H // 2 - 1
            out.append(f'<g class="ev last-of-worker" data-v="{t.last_event_version}"><title>'
                       f'v{t.last_event_version}: the last event of worker '
                       f'{esc(t.previous_worker)}</title><path d="M{x0 - 5} {cy - 5} '
                       f'L{x0 + 5} {cy + 5} M{x0 + 5} {cy - 5} L{x0 - 5} {cy + 5}" '
                       f'stroke="{color}" stroke-width="2.5"/></g>')
    # speech: one rect per bot turn
    top = tops["speech"]
    for s in tl.speech:
        x0, x1 = scale.x(s.start_us, left), scale.x(s.end_us, right)
        v = s.start_version or s.end_version or tl.first_version
        out.append(f'<g class="ev speech-turn" data-v="{v}"><rect class="speech" x="{x0}" '
                   f'y="{top + 4}" width="{max(x1 - x0, 2):.1f}" height="{LANE_H - 10}" '
                   f'fill="{COLORS["speech"]}"><title>bot speaking, generation '
                   f'{esc(s.generation)}; {esc(s.duration_ms)} ms; ended by '
                   f'{esc(s.end_source)}</title></rect>'
                   + _label(x0, x1, top + 16, f"g{s.generation}", "bar-label light") + "</g>")
    # tools: a bar from request to the send, the run part solid
    top = tops["tools"]
    for row, x0, x1, c in placed:
        ty = top + 3 + row * (TOOL_ROW_H + 2)
        v = c.requested_version or c.finished_version or (c.attempts[0]["version"]
                                                          if c.attempts else tl.first_version)
        tip = (f"{c.tool_call_id} {c.name or ''}: {c.outcome or 'pending'}; waited "
               f"{c.wait_ms} ms, ran {c.run_ms} ms; "
               + (f"sent via {c.sent_via} on generation {c.sent_generation}"
                  if c.sent_at_us else "not sent"))
        out.append(f'<g class="ev tool" data-v="{v}" data-call="{esc(c.tool_call_id)}">'
                   f'<title>{esc(tip)}</title><rect x="{x0}" y="{ty}" width="{x1 - x0:.1f}" '
                   f'height="{TOOL_ROW_H}" rx="2" fill="{_tool_color(c)}" fill-opacity="0.45"/>')
        if c.started_at_us is not None:
            r0 = scale.x(c.started_at_us, left)
            r1 = scale.x(c.finished_at_us, right) if c.finished_at_us else right
            out.append(f'<rect x="{r0}" y="{ty}" width="{max(r1 - r0, 2):.1f}" '
                       f'height="{TOOL_ROW_H}" fill="{_tool_color(c)}"/>')
        out.append(_label(x0, x1, ty + 11, f"{c.name or c.tool_call_id}"))
        out.append("</g>")
    # point events, by the table of kinds
    for e in tl.entries:
        kind = KINDS.get(e.type)
        shape = kind.mark if kind is not None else ("big" if e.level == "error" else "dot")
        lane = lane_of(e.type)
        if e.level == "error" and shape is None:
            lane, shape = "errors", "big"
        if shape is None or lane not in tops:
            continue
        color = COLORS["errors"] if e.level == "error" else COLORS.get(lane, "#555")
        if e.type == "session.worker_attached":
            color = COLORS["planned"] if "takeover_planned" in e.flags else COLORS["takeover"]
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
                       f'r="{6 if shape == "big" else 3}" fill="{color}"/></g>')
    out.append("</svg>")
    return "".join(out)


def overview_svg(ov: Overview, window: tuple[int, int] | None, link) -> str:
    """The whole call in buckets: one heat row per lane; a click jumps to that bucket
    (`link(version)`: the URL of the page holding that version)."""
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
            href = link(v)
            out.append(f'<a href="{esc(href)}"><rect x="{LABEL + b * bw:.1f}" y="{y}" '
                       f'width="{max(bw - 0.5, 1):.1f}" height="{h - 3}" '
                       f'fill="{COLORS.get(lane, "#555")}" fill-opacity="{op:.2f}">'
                       f'<title>{n} {esc(lane)} events from version {v}</title></rect></a>')
    out.append(f'<text x="{LABEL}" y="11" class="axis">{esc(iso(ov.start_us))}</text>')
    out.append(f'<text x="{WIDTH - 10}" y="11" class="axis" text-anchor="end">'
               f'{esc(iso(ov.end_us))}</text></svg>')
    return "".join(out)


def per_hour_svg(hours: list[dict]) -> str:
    """Calls per hour as bars (per day over more than a week), labelled along the axis."""
    if not hours:
        return '<p class="empty">no hours</p>'
    unit = "h"
    if len(hours) > 168:
        days: dict[str, int] = {}
        for h in hours:
            days[h["hour"][:10]] = days.get(h["hour"][:10], 0) + h["calls"]
        hours, unit = [{"hour": d, "calls": n} for d, n in days.items()], "d"
    height, base = 160, 130
    bw = max(min((WIDTH - LABEL - 10) / len(hours), 40), 1)
    peak = max(h["calls"] for h in hours) or 1
    out = [f'<svg class="per-hour" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
           f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
           'aria-label="calls per hour">',
           f'<text class="axis" x="6" y="14">{peak} calls per {"hour" if unit == "h" else "day"}'
           '</text>',
           f'<line x1="{LABEL}" x2="{WIDTH - 10}" y1="{base}" y2="{base}" stroke="#999"/>']
    every = max(1, math.ceil(80 / bw))  # a label every 80 px at least
    for i, h in enumerate(hours):
        x = LABEL + i * bw
        bh = (base - 20) * h["calls"] / peak
        out.append(f'<rect class="hour-bar" x="{x:.1f}" y="{base - bh:.1f}" '
                   f'width="{max(bw - 1, 1):.1f}" height="{bh:.1f}" fill="{COLORS["speech"]}">'
                   f'<title>{esc(h["hour"])}: {h["calls"]} calls</title></rect>')
        if i % every == 0:
            label = h["hour"][5:13].replace("T", " ") + "h" if unit == "h" else h["hour"][5:10]
            out.append(f'<text class="axis" x="{x:.1f}" y="{base + 14}">{esc(label)}</text>')
    out.append("</svg>")
    return "".join(out)
