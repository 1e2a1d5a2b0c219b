"""Across calls: `calls` (the list, filtered and paged) and `stats` (the fleet)."""

from __future__ import annotations

from typing import Optional

import typer

from .common import (
    DbOption, JsonOption, SchemaOption, fail, now_us, print_json, say, show, with_store,
)


def calls(since: Optional[str] = typer.Option(None, "--since", help="Started at or after "
                                              "(ISO 8601, or an age like 2h)."),
          until: Optional[str] = typer.Option(None, "--until", help="Started before."),
          status: Optional[str] = typer.Option(None, "--status", help="open | closed | stale"),
          search: Optional[str] = typer.Option(None, "--search", help="Call id contains."),
          text: Optional[str] = typer.Option(None, "--text", help="A transcript, a tool's "
                                             "arguments, result or error contains (any case)."),
          tool: Optional[str] = typer.Option(None, "--tool", help="Asked for this tool."),
          failed: bool = typer.Option(False, "--failed", help="A tool call failed."),
          takeover: bool = typer.Option(False, "--takeover", help="Taken over by another "
                                        "worker (a crash or a hand-over)."),
          anomaly: bool = typer.Option(False, "--anomaly", help="An anomaly was recorded."),
          min_duration: Optional[str] = typer.Option(None, "--min-duration",
                                                     help="At least this long (90s, 2m, 1h)."),
          max_duration: Optional[str] = typer.Option(None, "--max-duration",
                                                     help="At most this long."),
          sort: str = typer.Option("newest", "--sort", help="newest | oldest | longest | "
                                   "shortest | most-events | recent-activity"),
          limit: int = typer.Option(50, "--limit", help="Calls per page."),
          after: Optional[str] = typer.Option(None, "--after", help="Continue after this call "
                                              "(the last one of the previous page)."),
          db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
          as_json: bool = JsonOption) -> None:
    """List calls: start, duration, status, counts of tool calls, reconnects, takeovers."""
    from ..audit import CallFilter, parse_time
    from ..audit.queries import list_calls
    from ..audit.summaries import parse_duration
    from ..audit.text import calls_table

    try:
        flt = CallFilter(parse_time(since), parse_time(until), status, search, after, limit,
                         text=text or None, tool=tool or None, failed=failed,
                         takeover=takeover, anomaly=anomaly,
                         min_duration_s=parse_duration(min_duration),
                         max_duration_s=parse_duration(max_duration), sort=sort)
    except ValueError as exc:
        fail(str(exc))
    try:
        page = with_store(db, schema, lambda store: list_calls(store, flt, now_us()))
    except ValueError as exc:  # --after names no call
        fail(str(exc))
    if as_json:
        print_json(page.to_json())
    elif not page.calls:  # (headers over nothing read as a listing that failed)
        filtered = any((since, until, status, search, text, tool, failed, takeover, anomaly,
                        min_duration, max_duration, after))
        say("no calls match" if filtered else "no calls yet")
    else:
        show(calls_table(page.calls, page.next_after))



def stats(since: str = typer.Option("24h", "--since", help="Calls that started at or after "
                                    "(ISO 8601, or an age like 24h)."),
          until: Optional[str] = typer.Option(None, "--until", help="…and before (default: "
                                              "now)."),
          db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
          as_json: bool = JsonOption) -> None:
    """The fleet: calls per hour, takeovers (crash or planned), anomalies, calls in doubt,
    tool wait and result send latency percentiles."""
    from ..audit import parse_time
    from ..audit.models import Stats, dump
    from ..audit.queries import fleet_stats
    from ..audit.text import stats_view

    try:
        since_us, until_us = parse_time(since), parse_time(until) or now_us()
        if since_us is None:
            raise ValueError("--since: a time or an age is needed")
    except ValueError as exc:
        fail(str(exc))
    if since_us >= until_us:
        fail("--since must be before --until")
    data = dump(Stats, with_store(db, schema, lambda store: fleet_stats(store, since_us,
                                                                         until_us)))
    if as_json:
        print_json(data)
    else:
        show(stats_view(data))
