"""One call seen whole: `timeline`, `state` at any point, `export` as JSON Lines."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from .common import (
    DbOption, JsonOption, RedactConfigOption, RedactKeysOption, RedactOption, SchemaOption,
    UserError, fail, json_line, now_us, print_json, redactor_for, require_call, show, with_store,
)


async def _point(store, call: str, text: str, option: str) -> int:
    """A version from --at/--from: a version, +offset from the call's start, or a time."""
    from ..audit.queries.points import version_of_point

    try:
        return await version_of_point(store, call, text)
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None


def _event_types() -> set[str]:
    from ..events import catalogue

    return set(catalogue())


def _known_type(name: str) -> bool:
    """An event type, or a prefix of some (`tool.`, `tool.*`)."""
    prefix = name.rstrip("*")
    types = _event_types()
    return prefix in types or (prefix.endswith(".") and any(t.startswith(prefix) for t in types))


def timeline(call: str,
             from_point: str = typer.Option("1", "--from", help="First event to list: a "
                                            "version, +12.5s into the call, or a time."),
             limit: Optional[int] = typer.Option(None, "--limit", help="At most this many "
                                                 "events (default: all)."),
             at: Optional[str] = typer.Option(None, "--at", help="List from the event at "
                                              "this point (a version, +12.5s, or a time)."),
             lane: Optional[str] = typer.Option(None, "--lane", help="Only these lanes "
                                                "(comma-separated: tools,errors)."),
             event_type: Optional[str] = typer.Option(None, "--type", help="Only these event "
                                                      "types (comma-separated; tool. for a "
                                                      "prefix)."),
             redact: bool = RedactOption, redact_keys: Optional[str] = RedactKeysOption,
             redact_config: Optional[str] = RedactConfigOption,
             db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
             as_json: bool = JsonOption) -> None:
    """One ordered view of a call: speech, tool calls (wait, run, send), reconnects,
    takeovers… Facts are the whole call's; --from/--limit/--lane/--type choose what is
    listed."""
    from ..audit import LANES, build_timeline
    from ..audit.queries import call_summary, read_previews, window_facts
    from ..audit.streaming import write_timeline_json
    from ..audit.timeline import Timeline, tool_calls_in, unreadable_call
    from ..audit.text import timeline_view

    redactor = redactor_for(redact, redact_keys, redact_config)
    lanes = [x.strip() for x in (lane or "").split(",") if x.strip()]
    unknown = [x for x in lanes if x not in LANES]
    if unknown:
        fail(f"unknown lane {unknown[0]!r}; use one of {', '.join(LANES)}")
    types = [x.strip() for x in (event_type or "").split(",") if x.strip()]
    unknown_types = [t for t in types if not _known_type(t)]
    if unknown_types:  # (as --lane: a typo would list nothing and look like a quiet call)
        fail(f"unknown event type {unknown_types[0]!r}; a type or a prefix ending in '.' "
             f"(tool.), one of: {', '.join(sorted(_event_types()))}")

    async def go(store):
        head = await require_call(store, call)
        point = await _point(store, call, at if at is not None else from_point,
                             "--at" if at is not None else "--from")
        start = max(point, 1)  # versions start at 1: --from 0 or less is the start
        if start > head:  # (an empty page would look like a call with nothing in it)
            raise UserError(f"call {call} has versions 1–{head}: "
                            f"{'--at' if at is not None else '--from'} {point} is past its end")
        # With a filter the limit counts what is listed: read on to the end, cut after.
        to = head if limit is None or lanes or types else min(head, start + max(limit, 1) - 1)
        # --json streams the window: its tool calls are found without holding its events.
        # The text shows previews of values: the window is read as previews. The facts are
        # folds of previews either way (--json takes the values it shows whole from the
        # events: `whole_values_of`).
        recs = [] if as_json else await read_previews(store, call, start, to)
        prior, whole, note = await window_facts(store, call, start, to, head,
                                                tool_calls=None if as_json
                                                else tool_calls_in(recs), previews=True)
        if note is not None and as_json:
            recs = await store.read(call, from_version=start, to_version=to)
        summary = await call_summary(store, call, now_us())
        if as_json and note is None:  # written as it is built: first bytes early
            await write_timeline_json(sys.stdout.write, store, call, start, to,
                                      t0_us=summary.started_at_us if summary else None,
                                      prior=prior, whole=whole, summary=summary,
                                      redactor=redactor, keep=Timeline.keeps(lanes, types),
                                      limit=None if limit is None else max(limit, 1))
            return None, None
        tl = build_timeline(redactor.redact_records(recs), call_id=call,
                            t0_us=summary.started_at_us if summary else None,
                            prior=prior, whole=whole,
                            redact_state=redactor.redact_state)
        if note is not None:
            tl.problems.insert(0, unreadable_call(start, note))
        return tl, summary

    tl, summary = with_store(db, schema, go)
    if tl is None:
        return  # (written)
    if lanes or types:
        tl = tl.only(lanes, types)
        if limit is not None and len(tl.entries) > max(limit, 1):
            tl.entries = tl.entries[:max(limit, 1)]
            tl.last_version = tl.entries[-1].version  # (the versions searched to list them)
    if as_json:
        print_json(tl.to_json(summary))
    else:
        show(timeline_view(tl))


def state(call: str, at: Optional[str] = typer.Option(None, "--at", help="Fold up to this "
                                                      "point: a version, +12.5s into the "
                                                      "call, or a time."),
          redact: bool = RedactOption, redact_keys: Optional[str] = RedactKeysOption,
          redact_config: Optional[str] = RedactConfigOption,
          db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
          as_json: bool = JsonOption) -> None:
    """The projection of a call at any point: deferred, running, in doubt, to send."""
    from ..audit import export_line, state_view
    from ..audit.export import without_values
    from ..audit.fmt import preview_record
    from ..audit.models import State, dump
    from ..audit.queries import state_at
    from ..audit.text import state_view_text

    redactor = redactor_for(redact, redact_keys, redact_config)

    async def go(store):
        head = await require_call(store, call)
        version = None if at is None else await _point(store, call, at, "--at")
        if version is not None and not 1 <= version <= head:  # (never another version)
            raise UserError(f"call {call} has versions 1–{head}: --at {at} is not one of them")
        # The text shows no value: its state is folded from previews (memory bounded by the
        # largest event, not by the call's conversation).
        s = await state_at(store, call, version, previews=not as_json)
        rec = await store.read(call, from_version=s.version, to_version=s.version)
        if rec and not as_json:  # (the text shows the event's type and time alone)
            rec = [preview_record(rec[0])]
        return s, (export_line(rec[0], redactor) if rec else None)

    s, event = with_store(db, schema, go)
    view = state_view(s, call)
    if not as_json:  # the text shows no value: none is scrubbed (seconds for a 10 MB one)
        view = without_values(view)
    view = redactor.redact_state(view)
    view = dump(State, {**view, "event": event})
    if as_json:
        print_json(view)
    else:
        show(state_view_text(view))


def export(call: str, redact: bool = RedactOption,
           redact_keys: Optional[str] = RedactKeysOption,
           redact_config: Optional[str] = RedactConfigOption,
           db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption) -> None:
    """Every event of a call as JSON Lines (one event a line; secrets always masked)."""
    from ..audit import export_line
    from ..audit.queries import iter_records
    from ..errors import StreamDamaged

    redactor = redactor_for(redact, redact_keys, redact_config)

    async def go(store):
        try:
            head, damage = await require_call(store, call), None
        except StreamDamaged as exc:  # export what is stored all the same, then say so
            head, damage = None, exc
        async for chunk in iter_records(store, call, to_version=head):
            sys.stdout.write("".join(json_line(export_line(r, redactor)) for r in chunk))
        if damage is not None:
            sys.stdout.flush()
            raise damage  # exit 2: nobody takes what went out for the whole call

    with_store(db, schema, go)
