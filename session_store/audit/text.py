"""Rich renderables for the CLI (pure: builds tables), its console and `print_whole`.

Every cell is a `rich.text.Text` made by `T`, never markup, and through `fmt.printable`: call
ids, transcripts and tool results are data; a "[bold]" inside them prints as written and an
escape sequence prints escaped. Id columns never shrink (`id_column`): a terminal too narrow
for a table gets it wider than itself (`print_whole`) rather than a cut id.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from .fmt import clip, iso, printable, stamp, words
from .replay import ReplayReport
from .summaries import CallSummary
from .timeline import Entry, Timeline

LEVEL_STYLE = {"info": "", "warn": "yellow", "error": "bold red"}
STATUS_STYLE = {"open": "green", "closed": "", "stale": "yellow"}
#: Width a console takes when its output is not a terminal: no line is ever wrapped.
UNWRAPPED = 1_000_000


def output_console(file: TextIO | None = None, stderr: bool = False,
                   width: int | None = None) -> Console:
    """The console every command prints on. A terminal gets its width (or `width`) and
    colours; a pipe or a file gets no wrapping at all, whatever $COLUMNS says, and no
    colours."""
    stream = file or (sys.stderr if stderr else sys.stdout)
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        return Console(file=file, stderr=stderr, width=width)
    return Console(file=file, stderr=stderr, width=UNWRAPPED, soft_wrap=True,
                   no_color=True, highlight=False, force_terminal=False)


def T(value: Any, style: str = "") -> Text:  # noqa: N802 - reads like a constructor
    return Text("" if value is None else printable(value), style=style)


def _dur(ms_value: float | None) -> str:
    if ms_value is None:
        return "–"
    return f"{ms_value:.0f} ms" if ms_value < 10_000 else f"{ms_value / 1000:.1f} s"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def _table(*columns: str, title: str | None = None, caption: str | None = None,
           wrap: tuple[str, ...] = ()) -> Table:
    """A table whose `wrap` columns (free text) wrap on a narrow terminal, never crop; the
    others (ids, times, counts) keep each value on one line, whatever the width: the CLI
    prints a table wider than the terminal rather than cut an id (`unbreakable`)."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title=title,
              title_justify="left", title_style="bold", caption=caption,
              caption_justify="left")
    for name in columns:
        if name in wrap:
            t.add_column(name, overflow="fold")
        else:
            t.add_column(name, no_wrap=True, overflow="fold")
    return t


def unbreakable(renderable: Any) -> Any:
    """The renderable with each no-wrap column as wide as its widest value, so that rich
    measures what it needs whole (it measures text by its longest word otherwise, then
    crops the cell)."""
    parts = renderable.renderables if isinstance(renderable, Group) else [renderable]
    for part in parts:
        if isinstance(part, Table):
            for column in part.columns:
                cells = [Text.from_markup(c) if isinstance(c, str) else c
                         for c in column.cells]
                texts = [c.plain for c in cells if isinstance(c, Text)] + [str(column.header)]
                if column.no_wrap:
                    widest = max(Text(t).cell_len for t in texts)
                else:  # a wrapping column breaks between words, never inside one
                    widest = max(Text(w).cell_len for t in texts for w in t.split() or [""])
                column.min_width = max(column.min_width or 0, widest)
    return renderable


def print_whole(console: Console, renderable: Any) -> None:
    """A table or a view: on a terminal too narrow for its ids, printed wider than the
    terminal (which wraps the lines) rather than with an id cut; into a pipe or a file, each
    line as it is, without the padding a table's cells carry."""
    from rich.measure import Measurement

    renderable = unbreakable(renderable)
    if console.is_terminal:
        # (measured without the terminal's limit: rich clamps a measurement to the width)
        need = Measurement.get(console, console.options.update_width(UNWRAPPED),
                               renderable).minimum
        if need > console.width:  # (rich prints no wider than its console's width)
            console = Console(file=console.file, width=need)
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    console.file.write("\n".join(line.rstrip() for line in captured.get().split("\n")))


def schemas_table(described: dict[str, str]) -> Table:
    """`schema` without a name: each output's name and what it is."""
    table = _table("name", "what", wrap=("what",))
    for name, what in described.items():
        table.add_row(T(name), T(what))
    return table


CALLS_LEGEND = ("counts (zeros left out): ev events; tools tool calls; recon reconnects; crash "
                "takeovers after the worker died; handover planned takeovers; err failed tool "
                "calls + anomalies; doubt tool calls whose outcome is unknown; silent: since "
                "the last event")


def _counts(c: CallSummary) -> str:
    errors = c.failures + c.anomalies
    named = [(c.events, "ev"), (c.tool_calls, "tools"), (c.reconnects, "recon"),
             (c.crashes, "crash"), (c.handovers, "handover"), (errors, "err"),
             (c.in_doubt, "doubt")]
    return ", ".join(f"{n} {what}" for n, what in named if n)


def calls_table(calls: list[CallSummary], next_after: str | None) -> Group:
    # Fits 80 columns with a 36-character id: the id stays whole, start, status and the
    # counts wrap between their words.
    table = _table("call", "start", "dur", "status", "counts", caption=CALLS_LEGEND,
                   wrap=("start", "status", "counts"))
    for c in calls:
        errors = c.failures + c.anomalies
        status = c.status + (f", silent {_ago(c.silent_s)}" if c.silent_s is not None else "")
        table.add_row(T(c.call_id), T((iso(c.started_at_us) or "")[:16].replace("T", " ")
                                      + " UTC"),
                      T(f"{c.duration_s:.1f}s"), T(status, STATUS_STYLE.get(c.status, "")),
                      T(_counts(c), "red" if errors else ("yellow" if c.crashes else "")))
    parts: list[Any] = [table]
    if next_after is not None:
        parts.append(T(f"more: --after {next_after}", "dim"))
    return Group(*parts)


def entry_line(e: Entry, call: str | None = None) -> str:
    """One event as one line (tail): UTC time, call and version, lane, the summary."""
    where = f"{call}@v{e.version}" if call else f"v{e.version}"
    return printable(f"{stamp(e.at_us)} {where} {e.lane:<12} {e.summary}")


def timeline_view(tl: Timeline) -> Group:
    def off(at_us: int | None) -> str:
        return "–" if at_us is None else f"+{(at_us - tl.t0_us) / 1e6:.3f}"

    head = (f" of {tl.head}" if tl.head and (tl.first_version != 1 or tl.last_version != tl.head)
            else "")
    parts: list[Any] = [T(f"call {tl.call_id}: versions {tl.first_version}–{tl.last_version}"
                          f"{head}, started {iso(tl.t0_us)} (+s: seconds since then)", "bold")]
    entries = _table("v", "+s", "lane", "what", wrap=("what",))
    for e in tl.entries:
        what = e.summary
        if "last_of_worker" in e.flags:
            what += "  ◀ last event of this worker before the takeover"
        entries.add_row(T(e.version), T(f"{e.offset_ms / 1000:.3f}"), T(e.lane),
                        T(what, LEVEL_STYLE.get(e.level, "")))
    parts.append(entries)
    if tl.tool_calls:
        # (80 columns: whether it waited for the bot is said in "waited"; words wrap)
        # (a header does not wrap: "in model" is given as two lines)
        tools = _table("call", "tool", "asked", "waited", "ran", "outcome", "sent",
                       "in\nmodel", title="tool calls",
                       wrap=("waited", "outcome", "sent", "in\nmodel"))
        for c in tl.tool_calls.values():
            outcome = c.outcome or ("running" if c.started_at_us else "waiting")
            if c.reused_from:
                outcome += f" (from {c.reused_from})"
            if c.outcome_unknown:
                outcome += " (unknown)"
            confirmed = len([s for s in c.sends if s.confirmed])
            sent = (f"{off(c.sent_at_us)} {words(c.sent_via)} g{words(c.sent_generation)}"
                    + (f" (+{confirmed - 1} more)" if confirmed > 1 else "")
                    if c.sent_at_us else "not sent")
            in_model = c.in_model_words
            waited = _dur(c.wait_ms) + (", deferred" if c.deferred else "")
            tools.add_row(T(c.tool_call_id), T(words(c.name)), T(off(c.requested_at_us)),
                          T(waited), T(_dur(c.run_ms)),
                          T(outcome, "red" if c.outcome == "failed" else ""),
                          T(sent, "" if c.sent_at_us else "yellow"),
                          T(in_model, "bold red" if in_model == "NO" else ""))
        parts.append(tools)
    if tl.reconnects:
        rec = _table("asked", "reason", "waited", "closed", "down", "gen", "resumed from",
                     title="reconnects (asked: requested; closed: the old session disconnected; "
                     "gen: generation)", wrap=("asked", "reason", "closed"))
        for r in tl.reconnects:
            reason = words(r.reason) if r.reason else "–"
            if r.keys:
                reason += f" ({words(r.keys)})"
            if r.disconnect_reason and r.disconnect_reason != r.reason:
                reason += f"; disconnect: {words(r.disconnect_reason)}"
            rec.add_row(T(f"v{r.requested_version} {off(r.requested_at_us)}"
                          if r.requested_version else "–"), T(reason), T(_dur(r.waited_ms)),
                        T(f"v{r.disconnected_version} {off(r.disconnected_at_us)}"
                          if r.disconnected_version else "–"), T(_dur(r.downtime_ms)),
                        T(f"{words(r.from_generation)} → {words(r.generation)}"),
                        T(clip(r.resumed_handle, 60) if r.resumed_handle else
                          ("fresh (seeded)" if r.connected_version else "(not reconnected)")))
        parts.append(rec)
    if tl.speech:
        talk = [s.duration_ms for s in tl.speech if s.duration_ms is not None]
        parts.append(T(f"bot speech: {len(tl.speech)} turn{'s' if len(tl.speech) != 1 else ''}, "
                       f"{sum(talk) / 1000:.1f} s in total"))
    for t in tl.takeovers:
        what = "planned hand-over" if t.kind == "planned" else "crash"
        before = (f"; worker {words(t.previous_worker)}'s last event v{t.last_event_version} "
                  f"{off(t.last_event_at_us)} ({t.last_event_type}), then "
                  f"{(t.silent_ms or 0) / 1000:.2f} s of silence" if t.last_event_version else "")
        parts.append(T(f"takeover at v{t.version} {off(t.at_us)} ({what}){before}; worker "
                       f"{words(t.worker)} took over, epoch {words(t.epoch)}", "yellow"))
    if tl.problems:
        probs = _table("v", "problem", "detail", title="problems", wrap=("detail",))
        for p in tl.problems:
            probs.add_row(T(p["version"]), T(p["kind"], "red"), T(clip(p["detail"], 200)))
        parts.append(probs)
    return Group(*parts)


def state_view_text(view: dict[str, Any]) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_column(no_wrap=True)
    head.add_column(overflow="fold")
    for key in ("call", "version", "closed", "worker", "epoch", "takeovers", "generation",
                "connected", "bot_speaking", "reconnect_pending", "newest_handle", "deferred",
                "running", "in_doubt", "finished_after_end", "to_send", "unanswered"):
        head.add_row(T(key, "bold"), T(words(view.get(key), 400)))
    event = view.get("event")
    if event:
        head.add_row(T("event", "bold"), T(f"{event['type']} at {event['recorded_at']}"))
    calls = _table("tool call", "tool", "status", "attempt", "in current session", "sends",
                   wrap=("sends",))
    for c in view["tool_calls"]:
        sends = "; ".join(f"{words(s['via'])} g{words(s['generation'])} v{s['version']} "
                          + ("sent" if s["confirmed"] else "not confirmed")
                          for s in c["sends"]) or "none"
        calls.add_row(T(c["tool_call_id"]), T(words(c["name"])), T(c["status"]),
                      T(words(c["attempt"])), T(words(c["in_current_session"])), T(sends))
    note = T("sends: sent = the write returned; not confirmed = the process may have died "
             "before it did", "dim")
    return Group(head, calls, note) if view["tool_calls"] else Group(head)


def replay_text(report: ReplayReport) -> Group:
    parts: list[Any] = [T(f"replayed {report.events} events of {report.call_id}: "
                          f"{report.decisions_checked} decisions and {report.effects_checked} "
                          f"effects checked, {len(report.divergences)} divergences",
                          "bold green" if report.ok else "bold red"),
                        T(report.coverage, "bold" if not report.not_replayed else "bold red")]
    for d in report.divergences:
        where = f"v{d.version}" + (f"–{d.to_version}" if d.to_version != d.version else "")
        parts.append(T(""))
        parts.append(T(f"{where} [{d.kind}] {d.message}", "bold"))
        if d.observation:
            parts.append(T(f"  observation: {clip(d.observation, 2000)}"))
        parts.append(T(f"  logged:  {clip(d.logged, 2000)}"))
        parts.append(T(f"  today:   {clip(d.decided, 2000)}"))
    if report.error:
        parts.append(T(f"error: {report.error}", "bold red"))
    return Group(*parts)


def stats_view(data: dict[str, Any]) -> Group:
    """`session-store stats`: the fleet over a time range (models.Stats)."""
    parts: list[Any] = [T(f"calls that started {data['since']} – {data['until']}: "
                          f"{data['calls']}", "bold")]
    hours = _table("hour (UTC)", "calls", title="calls per hour")
    for h in data["calls_per_hour"]:
        if h["calls"]:
            hours.add_row(T(h["hour"][:13].replace("T", " ") + ":00"), T(h["calls"]))
    parts.append(hours)
    t, a = data["takeovers"], data["anomalies"]
    parts.append(T(f"takeovers: {t['crash']} after a crash, {t['planned']} planned hand-overs"))
    parts.append(T(f"anomalies: {a['total']}" + (" (" + ", ".join(
        f"{k} {n}" for k, n in a["by_kind"].items()) + ")" if a["by_kind"] else "")))
    parts.append(T(f"calls with a tool call in doubt: {len(data['in_doubt_calls'])}"
                   + (f" ({words(data['in_doubt_calls'], 400)})" if data["in_doubt_calls"]
                      else "")))
    lat = _table("latency", "count", "p50", "p90", "p99", "max", title="latency (ms)")
    for key, label in (("tool_wait_ms", "tool wait (requested → started)"),
                       ("result_send_ms", "result send (outcome → write returned)")):
        p = data[key]
        lat.add_row(T(label), T(p["count"]), *(T(words(p[q])) for q in ("p50", "p90", "p99",
                                                                         "max")))
    parts.append(lat)
    return Group(*parts)
