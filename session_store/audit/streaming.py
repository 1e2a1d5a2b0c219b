"""`timeline --json` written as it is built: the first bytes as soon as the call's facts are
known, then each entry as its event is read, then the facts that need the whole window.

Built whole, a 100 MB call's timeline held every entry, then the whole document as one
string: the first byte came at the end, after ~10x the call's size in memory. Here memory is
bounded by a chunk of events (iter_records) and the entries of one event, and the bytes are
the ones `json.dumps(timeline_json(...), indent=2)` would have written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from ..storage.schema import events
from .jsontext import escape_unsafe, write_json
from .models import Entry, Timeline, dump, entry_json, timeline_json
from .queries.base import engine_of
from .queries.reading import iter_records, whole_values_of
from .timeline import (Entry as TimelineEntry, Prior, TimelineBuilder, WholeCall,
                       values_from_final)
from .timeline.entries import Timeline as TimelineFacts

_HOLE = "\x00entries\x00"  # where the entries go, in the document around them


async def write_timeline_json(raw_write: Callable[[str], Any], store, call_id: str, first: int,
                              last: int, *, t0_us: int | None, prior: Prior | None,
                              whole: WholeCall | None, summary, redactor,
                              keep: Callable[[TimelineEntry], bool],
                              limit: int | None = None) -> None:
    """Write (`raw_write(text)`) the timeline of versions first..last of a call as JSON, as
    `print_json(build_timeline(...).only(...).to_json(summary))` would, a piece at a time;
    at most `limit` entries of those `keep` lists, and nothing a terminal acts on (jsontext)."""
    def write(text: str) -> None:  # every piece escaped on its way out
        raw_write(escape_unsafe(text))

    times = await _recorded_at(store, call_id, first, last)
    facts = TimelineFacts(call_id, t0_us if t0_us is not None else times[first], first, last,
                          times[first], times[last], head=whole.state.version if whole else 0)
    head_text = _document(facts, summary, [_HOLE])
    write(head_text[:head_text.index(json.dumps(_HOLE))].rstrip(" \n"))
    builder = TimelineBuilder(call_id, t0_us, prior)
    held: TimelineEntry | None = None  # written once the next event is in: a takeover
    written = 0                         # flags the entry before it (`last_of_worker`)

    def put(entry: TimelineEntry) -> None:
        nonlocal written
        if limit is not None and written >= limit:
            return
        # Indented by 4 as the document nests it: newlines in JSON text are only between
        # its tokens (a string's are escaped), and a 10 MB value goes out alone, uncopied.
        write(("\n" if not written else ",\n") + "    ")
        write_json(lambda text: raw_write(text.replace("\n", "\n    ")),
                   dump(Entry, entry_json(entry)), indent=2)
        written += 1

    async for chunk in iter_records(store, call_id, from_version=first, to_version=last):
        for rec in redactor.redact_records(chunk):
            entry = builder.add(rec)
            builder.tl.entries.clear()
            if held is not None and keep(held):
                put(held)
            held = entry
    if held is not None and keep(held):
        put(held)
    if whole is not None and held is not None:  # (the facts may be a fold of previews)
        whole = await whole_values_of(store, call_id, whole,
                                      values_from_final(builder.tl, whole.state))
    tl = builder.finish(whole, redactor.redact_state)
    tail_text = _document(tl, summary, [])
    write(("\n  ]" if written else "]") + tail_text[tail_text.index('"entries": []') + 13:]
          + "\n")


def _document(tl, summary, entries: list) -> str:
    """The timeline's JSON text (checked against its model) with `entries` as its entries."""
    data = dump(Timeline, timeline_json(tl, summary))
    return json.dumps({**data, "entries": entries}, indent=2, ensure_ascii=False)


async def _recorded_at(store, call_id: str, *versions: int) -> dict[int, int]:
    """When these versions of the call were recorded (their rows' times alone)."""
    async with engine_of(store).connect() as conn:
        rows = await conn.execute(select(events.c.version, events.c.recorded_at_us).where(
            events.c.stream_id == call_id, events.c.version.in_(versions)))
        return {version: at for version, at in rows}
