"""Rich renderables for the CLI (pure: builds tables, prints nothing).

Every cell is a `rich.text.Text`, never markup: call ids, transcripts and tool results are
data, and a "[bold]" inside them must print as written.
"""

from __future__ import annotations

import json
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .replay import ReplayReport
from .summaries import CallSummary
from .fmt import iso
from .timeline import Timeline

LEVEL_STYLE = {"info": "", "warn": "yellow", "error": "bold red"}
STATUS_STYLE = {"open": "green", "closed": "", "stale": "yellow"}


def T(value: Any, style: str = "") -> Text:  # noqa: N802 - reads like a constructor
    return Text("" if value is None else str(value), style=style)


def _dur(ms_value: float | None) -> str:
    if ms_value is None:
        return "–"
    return f"{ms_value:.0f} ms" if ms_value < 10_000 else f"{ms_value / 1000:.1f} s"


def calls_table(calls: list[CallSummary], next_after: str | None) -> Group:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  caption_justify="left",
                  caption="tools: tool calls; recon: reconnects; crash: takeovers by a new "
                          "worker; err: failed tool calls + anomalies")
    table.add_column("call", no_wrap=True, overflow="fold", min_width=10)
    table.add_column("start (UTC)", no_wrap=True)
    table.add_column("dur", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for name in ("ev", "tools", "recon", "crash", "err"):
        table.add_column(name, justify="right", no_wrap=True)
    for c in calls:
        errors = c.failures + c.anomalies
        table.add_row(T(c.call_id), T((iso(c.started_at_us) or "")[:16].replace("T", " ")),
                      T(f"{c.duration_s:.1f}s"), T(c.status, STATUS_STYLE.get(c.status, "")),
                      T(c.events), T(c.tool_calls), T(c.reconnects),
                      T(c.takeovers, "yellow" if c.takeovers else ""),
                      T(errors, "red" if errors else ""))
    parts: list[Any] = [table]
    if next_after is not None:
        parts.append(T(f"more: --after {next_after}", "dim"))
    return Group(*parts)


def timeline_view(tl: Timeline) -> Group:
    def off(at_us: int | None) -> str:
        return "–" if at_us is None else f"+{(at_us - tl.t0_us) / 1e6:.3f}"

    def table(*columns: str, title: str | None = None) -> Table:
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title=title,
                  title_justify="left", title_style="bold")
        for i, name in enumerate(columns):
            t.add_column(name, no_wrap=i == 0, overflow="fold")
        return t

    parts: list[Any] = [T(f"call {tl.call_id}: versions {tl.first_version}–{tl.last_version}, "
                          f"started {iso(tl.t0_us)} (+s: seconds since then)", "bold")]
    entries = table("v", "+s", "lane", "what")
    for e in tl.entries:
        entries.add_row(T(e.version), T(f"{e.offset_ms / 1000:.3f}"), T(e.lane),
                        T(e.summary, LEVEL_STYLE.get(e.level, "")))
    parts.append(entries)
    if tl.tool_calls:
        tools = table("call", "tool", "asked", "deferred", "waited", "ran", "outcome",
                      "delivered", "in model", title="tool calls")
        for c in tl.tool_calls.values():
            outcome = c.outcome or ("running" if c.started_at_us else "waiting")
            if c.reused_from:
                outcome += f" (from {c.reused_from})"
            if c.outcome_unknown:
                outcome += " (unknown)"
            confirmed = len([s for s in c.sends if s.confirmed])
            delivered = (f"{off(c.delivered_at_us)} {c.delivered_via} g{c.delivered_generation}"
                         + (f" (+{confirmed - 1} more)" if confirmed > 1 else "")
                         if c.delivered_at_us else "not delivered")
            in_model = "" if c.in_model is None else ("yes" if c.in_model else "NO")
            tools.add_row(T(c.call_id), T(c.name), T(off(c.requested_at_us)),
                          T("yes" if c.deferred else ""), T(_dur(c.wait_ms)), T(_dur(c.run_ms)),
                          T(outcome, "red" if c.outcome == "failed" else ""),
                          T(delivered, "" if c.delivered_at_us else "yellow"),
                          T(in_model, "bold red" if in_model == "NO" else ""))
        parts.append(tools)
    if tl.reconnects:
        rec = table("requested", "reason", "waited", "disconnected", "down", "generation",
                    "resumed from", title="reconnects")
        for r in tl.reconnects:
            reason = r.reason or ""
            if r.keys:
                reason += f" ({', '.join(map(str, r.keys))})"
            if r.disconnect_reason and r.disconnect_reason != r.reason:
                reason += f"; disconnect: {r.disconnect_reason}"
            rec.add_row(T(f"v{r.requested_version} {off(r.requested_at_us)}"
                          if r.requested_version else "–"), T(reason), T(_dur(r.waited_ms)),
                        T(f"v{r.disconnected_version} {off(r.disconnected_at_us)}"
                          if r.disconnected_version else "–"), T(_dur(r.downtime_ms)),
                        T(f"{r.from_generation} → {r.generation or '–'}"),
                        T(r.resumed_handle or ("fresh (seeded)" if r.connected_version
                                               else "(not reconnected)")))
        parts.append(rec)
    if tl.speech:
        talk = [s.duration_ms for s in tl.speech if s.duration_ms is not None]
        parts.append(T(f"bot speech: {len(tl.speech)} turns, "
                       f"{sum(talk) / 1000:.1f} s in total"))
    for t in tl.takeovers:
        parts.append(T(f"takeover at v{t['version']} {off(t['at_us'])}: worker {t['worker']} "
                       f"epoch {t['epoch']} ({t['reason']})", "yellow"))
    if tl.problems:
        probs = table("v", "problem", "detail", title="problems")
        for p in tl.problems:
            probs.add_row(T(p["version"]), T(p["kind"], "red"),
                          T(json.dumps(p["detail"], ensure_ascii=False, default=str)[:200]))
        parts.append(probs)
    return Group(*parts)


def state_view_text(view: dict[str, Any]) -> Group:
    head = Table.grid(padding=(0, 2))
    for key in ("call", "version", "closed", "worker", "epoch", "takeovers", "generation",
                "connected", "bot_speaking", "reconnect_pending", "newest_handle", "deferred",
                "running", "in_doubt", "undelivered", "unanswered"):
        head.add_row(T(key, "bold"), T(view.get(key)))
    calls = Table("call", "tool", "status", "attempt", "delivered", "sends")
    for cid, c in view["calls"].items():
        sends = ", ".join(f"{s['via']}@{s['generation']}{'' if s['confirmed'] else '?'}"
                          for s in c["sends"])
        calls.add_row(T(cid), T(c["name"]), T(c["status"]), T(c["attempt"]),
                      T(c["delivered"]), T(sends))
    return Group(head, calls)


def replay_text(report: ReplayReport) -> Group:
    parts: list[Any] = [T(f"replayed {report.events} events of {report.call_id}: "
                          f"{report.decisions_checked} decisions and {report.effects_checked} "
                          f"effects checked, {len(report.divergences)} divergences",
                          "bold green" if report.ok else "bold red")]
    for d in report.divergences:
        where = f"v{d.version}" + (f"–{d.to_version}" if d.to_version != d.version else "")
        parts.append(T(f"\n{where} [{d.kind}] {d.message}", "bold"))
        if d.observation:
            parts.append(T(f"  observation: {json.dumps(d.observation, default=str)}"))
        parts.append(T(f"  logged:  {json.dumps(d.logged, default=str, ensure_ascii=False)}"))
        parts.append(T(f"  today:   {json.dumps(d.decided, default=str, ensure_ascii=False)}"))
    if report.error:
        parts.append(T(f"error: {report.error}", "bold red"))
    return Group(*parts)
