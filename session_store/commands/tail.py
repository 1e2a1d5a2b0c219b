"""`tail`: new events as they are appended, one line each, through database outages."""

from __future__ import annotations

import asyncio
import sys
from typing import Optional

import typer

from ..errors import StoreUnavailable
from .common import (
    DbOption, RedactConfigOption, RedactKeysOption, RedactOption, SchemaOption, fail,
    json_line, redactor_for, require_call, say, with_store,
)


# `tail` asks again after an outage: first after this long, doubling up to the max.
TAIL_RETRY_FIRST_S, TAIL_RETRY_MAX_S = 0.5, 5.0


def tail(call: Optional[str] = typer.Argument(None, help="Follow this call (all calls if "
                                              "omitted)."),
         lines: Optional[int] = typer.Option(None, "-n", "--lines", min=0,
                                             help="Show the last N events first (default 10)."),
         from_now: bool = typer.Option(False, "--from-now", help="Only events from now on."),
         redact: bool = RedactOption,
         redact_keys: Optional[str] = RedactKeysOption,
         redact_config: Optional[str] = RedactConfigOption,
         db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
         as_json: bool = typer.Option(False, "--json", help="One export-format JSON line "
                                      "per event (the raw events).")) -> None:
    """Follow new events live, one line each in the timeline's words (Ctrl-C to stop). A
    followed call ends the tail when it closes."""
    from ..audit import export_line
    from ..audit.queries import follow, last_records, log_end, state_of_read
    from ..audit.fmt import preview_record
    from ..audit.text import entry_line
    from ..audit.timeline import Prior, TimelineBuilder

    if from_now and lines:
        fail("--from-now and -n do not go together: -n shows past events first")
    redactor = redactor_for(redact, redact_keys, redact_config)
    from ..storage.schema import valid_stream_id

    if call is not None and not valid_stream_id(call):
        fail(f"{call!r:.80} is not a call id (1 to 255 characters of text without NUL)")
    backlog = 0 if from_now else (lines if lines is not None else 10)
    builders: dict[str, TimelineBuilder] = {}

    async def show(store, rec) -> None:
        if as_json:
            sys.stdout.write(json_line(export_line(rec, redactor)))
            sys.stdout.flush()
            return
        b = builders.get(rec.stream_id)
        if b is None:
            # Mid-call: what came before says how this event reads (the generation, the
            # tool call it answers, the speech it ends).
            prior = None
            if rec.version > 1:
                previous = await store.read(rec.stream_id, from_version=rec.version - 1,
                                            to_version=rec.version - 1)
                prior = Prior(await state_of_read(store, rec.stream_id, rec.version - 1),
                              previous[0] if previous else None)
            first = await store.read(rec.stream_id, to_version=1)
            b = builders[rec.stream_id] = TimelineBuilder(
                rec.stream_id, first[0].recorded_at_us if first else None, prior)
            if len(builders) > 1000:  # the whole log's tail: forget the oldest call
                builders.pop(next(iter(builders)))
        entry = b.add(redactor.redact_record(preview_record(rec)))
        b.tl.entries.clear()  # (only the builder's context is kept, not every line)
        say(entry_line(entry, rec.stream_id))

    async def go(store):
        if call is not None:
            await require_call(store, call)
            newest = await last_records(store, max(backlog, 1), call)
            past, start = (newest[-backlog:] if backlog else []), newest[-1]
        else:
            past = await last_records(store, backlog) if backlog else []
            start = past[-1] if past else await log_end(store)
        for rec in past:
            await show(store, rec)
        if call is not None and start.type == "session.closed":
            return  # the call has ended: nothing will follow
        # A follow outlives database outages: it says so on stderr and goes on from the last
        # event it showed once the database answers again (nothing skipped, nothing twice).
        delay = TAIL_RETRY_FIRST_S
        while True:
            try:
                async for rec in follow(store, start, call):
                    start = rec
                    await show(store, rec)
                    if call is not None and rec.type == "session.closed":
                        return
                return
            except StoreUnavailable as exc:
                say(f"warning: {exc}; following again when it answers", stderr=True)
            while True:
                await asyncio.sleep(delay)
                delay = min(delay * 2, TAIL_RETRY_MAX_S)
                try:
                    await store.list_streams(limit=1)
                except StoreUnavailable:
                    continue
                say("the database answers again: following", stderr=True)
                delay = TAIL_RETRY_FIRST_S
                break

    try:
        with_store(db, schema, go)
    except KeyboardInterrupt:
        pass
