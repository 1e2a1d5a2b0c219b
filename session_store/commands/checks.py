"""Checking a call's record: `verify` (hash chains) and `replay` (today's decisions)."""

from __future__ import annotations

from typing import Optional

import typer

from .common import (
    DbOption, JsonOption, RedactConfigOption, RedactKeysOption, RedactOption, SchemaOption,
    UserError, fail, print_json, redactor_for, require_call, say, scrub, show, with_store,
)


def verify(call: Optional[str] = typer.Argument(None, help="Call id (all calls if omitted)."),
           db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
           as_json: bool = JsonOption) -> None:
    """Recompute hash chains; exit 1 and name the first bad event if anything was altered."""
    from ..storage.schema import valid_stream_id
    from ..audit.verify import verify_log

    async def go(store):
        if call is not None and not valid_stream_id(call):
            raise UserError(f"call {call!r} not found")
        reports = await verify_log(store, call)
        if call is not None and all(r.ok and r.events_checked == 0 for r in reports):
            raise UserError(f"call {call!r} not found")
        return reports

    from ..audit.models import Verify, dump

    reports = with_store(db, schema, go)
    bad = [r for r in reports if not r.ok]
    if as_json:
        print_json(dump(Verify, {"ok": not bad, "calls": [
            {"call": r.stream_id, "ok": r.ok, "events_checked": r.events_checked,
             "first_bad_version": r.first_bad_version,
             "first_bad_position": r.first_bad_position, "reason": scrub(r.reason)}
            for r in reports]}))
    else:
        for r in reports:
            if r.ok:
                say(f"ok   {r.stream_id}: {r.events_checked} events")
            else:
                say(f"BAD  {r.stream_id}: first bad event version {r.first_bad_version} "
                     f"(position {r.first_bad_position}): {scrub(r.reason)}", style="red")
    if bad:
        raise typer.Exit(1)


def replay(call: str,
           defer: str = typer.Option("all", "--defer", help="Tools deferred while the bot "
                                     "speaks: all | none | name,name"),
           idempotent: str = typer.Option("", "--idempotent", help="Idempotent tools "
                                          "(re-run when in doubt): name,name"),
           reuse: str = typer.Option("all", "--reuse", help="Tools whose re-issued equivalent "
                                     "call is answered from the record: all | none | name,name"),
           go_away_margin: Optional[float] = typer.Option(None, "--go-away-margin",
                                                          help="Seconds before a goAway "
                                                          "deadline to reconnect anyway."),
           end_call_on_give_up: Optional[str] = typer.Option(
               None, "--end-call-on-give-up", help="The reason the service ends a call with "
               "when it gives Gemini up (Policy.end_call_on_give_up; the phone bot's: "
               "gemini_unreachable)."),
           redact: bool = RedactOption, redact_keys: Optional[str] = RedactKeysOption,
           redact_config: Optional[str] = RedactConfigOption,
           db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption,
           as_json: bool = JsonOption) -> None:
    """Feed the log through today's decide/due and report every decision that differs."""
    from ..audit import parse_policy
    from ..audit import replay as run_replay
    from ..audit.text import replay_text

    try:
        policy = parse_policy(defer, idempotent, reuse, go_away_margin, end_call_on_give_up)
    except ValueError as exc:  # a margin < 0
        fail(str(exc))
    redactor = redactor_for(redact, redact_keys, redact_config)

    async def go(store):
        head = await require_call(store, call)
        return run_replay(await store.read(call, to_version=head), policy, call_id=call)

    # Divergences carry tool arguments and results: redacted as every output is (secrets
    # always; the rest as --redact or a config that forces it says).
    report = with_store(db, schema, go).redacted(redactor)
    if as_json:
        print_json(report.to_json())
    else:
        show(replay_text(report))
    if report.error:
        raise typer.Exit(2)
    if report.divergences:
        raise typer.Exit(1)


def reproduce(call: str,
              out: str = typer.Option(..., "--out", help="Directory to write the "
                                      "reproduction into (created)."),
              redact: bool = RedactOption,
              redact_keys: Optional[str] = RedactKeysOption,
              redact_config: Optional[str] = RedactConfigOption,
              db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption) -> None:
    """Write an offline reproduction of a call: the local Gemini Live server's script, the
    tools' recorded results and a pytest file that re-runs today's service and names the
    first decision it takes otherwise (docs/postmortem.md). Secrets are always masked."""
    from pathlib import Path

    from ..audit import export_line
    from ..audit.queries import iter_records
    from ..audit.reproduce import write

    redactor = redactor_for(redact, redact_keys, redact_config)

    async def go(store):
        head = await require_call(store, call)
        return [export_line(r, redactor) async for chunk in
                iter_records(store, call, to_version=head) for r in chunk]

    lines = with_store(db, schema, go)
    try:
        spec = write(Path(out), lines, redacted=redactor.config.enabled)
    except (OSError, ValueError) as exc:
        fail(f"reproduce: {exc}")
    say(f"wrote {out}: {len(spec['connections'])} connections, {len(spec['workers'])} "
        f"workers, {len(lines)} events to compare; run: pytest {out}")
    for note in spec["not_reproduced"]:
        say(f"  not reproduced: {note}")
