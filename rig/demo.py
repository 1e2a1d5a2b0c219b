"""The demo call: offline, on SQLite, with a real crash in the middle.

A real pipecat pipeline with DurableGeminiLiveLLMService talks to the local Gemini Live
server (TLS websockets, the real google-genai client). The bot speaks; a tool call arrives
mid-speech and is deferred; the app changes the prompt mid-turn (the reconnect waits for
the turn to end); the worker process is SIGKILLed while a tool result is in flight; a new
worker process takes the call over from the log and finishes it. Then the call is checked
against the server's record, the tools' side-effect ledger and the log (I1–I7), and its
timeline and verdict are printed.

With `live` (``session-store demo --live``, GOOGLE_API_KEY set) the same call runs against the
real Gemini Live API: a real model decides when to call the tools, so the call is complete
once everything it asked for has reached it, and it is checked against the log and the tool
ledger (there is no server record to check against).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

from rig.crash.case import Kill, LiveTarget, run_case
from session_store import open_store
from session_store.audit.queries import window_facts
from session_store.audit.text import output_console, print_whole
from session_store.audit.timeline import tool_calls_in
from session_store.storage.migrate import upgrade
from session_store.models import rules_for
from session_store.audit.verify import verify_log

console = output_console()


class LiveDemoUnavailable(RuntimeError):
    """The live demo cannot run here (no API key)."""


def default_model() -> str:
    """The model pipecat's GeminiLiveLLMService uses when none is given."""
    from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

    return str(GeminiLiveLLMService.Settings().model or "") or "models/gemini-3.8-live"


async def run_demo(db: str, quiet: bool = False, live: LiveTarget | None = None,
                   model: str | None = None, db_label: str | None = None) -> dict:
    """`db_label`: the --db as the user gave it (the next steps printed repeat it)."""
    model = (live.model if live else model) or default_model()
    if live is not None and not os.environ.get("GOOGLE_API_KEY"):
        raise LiveDemoUnavailable("--live talks to the real Gemini Live API: set GOOGLE_API_KEY "
                                  "(the key is read from the environment, never logged)")
    await upgrade(db)
    with tempfile.TemporaryDirectory(prefix="session-store-demo-") as tmp:
        if not quiet:
            where = ("the real Gemini Live API" if live else
                     f"a local Gemini Live server ({rules_for(model).family} rules)")
            console.print(f"[bold]demo call[/bold] on {model} against {where}: bot speaks, "
                          "a tool call arrives mid-speech, the prompt changes mid-turn, the "
                          "worker is killed while a result is in flight, a new worker takes "
                          "over…")
        # A call id a user's own calls could have, not the rig's scenario name.
        result = await run_case("live" if live else "prompt_change", db, workdir=Path(tmp),
                                kills=[Kill(after_event="tool.result_sending")], live=live,
                                timeout_s=150.0 if live else 60.0, model=model,
                                call_id=f"demo-{uuid.uuid4().hex[:12]}")
    store = await open_store(db)
    try:
        records = await store.read(result.call_id)
        chain_ok = all(r.ok for r in await verify_log(store, result.call_id))
        # The timeline as `session-store timeline` builds it: with the call's final state
        # (without it, "in model" cannot be told).
        prior, whole, _note = await window_facts(store, result.call_id, 1, len(records),
                                                 len(records),
                                                 tool_calls=tool_calls_in(records))
    finally:
        await store.close()
    verdict = {"ok": result.ok and chain_ok, "call": result.call_id, "model": model,
               "violations": result.violations, "events": len(records), "kills": result.kills,
               "workers": result.workers, "chain_verified": chain_ok, "live": live is not None,
               "takeover_s": [round(t, 3) for t in result.takeover_s]}
    if not quiet:
        from session_store.audit.text import timeline_view
        from session_store.audit.timeline import build_timeline

        print_whole(console, timeline_view(build_timeline(
            records, call_id=result.call_id, prior=prior, whole=whole)))
        takeover = f"{verdict['takeover_s'][0]:.2f} s" if verdict["takeover_s"] else "n/a"
        console.print(f"workers: {result.workers}, killed: {result.kills}, takeover to first "
                      f"action: {takeover}, events: {len(records)}")
        if verdict["ok"]:
            console.print("[bold green]verdict: OK[/bold green] — every tool call answered "
                          "exactly once, no tool ran twice, hash chain verified "
                          f"(`session-store verify {result.call_id}`)")
        else:
            console.print("[bold red]verdict: FAILED[/bold red]")
            for v in verdict["violations"]:
                console.print(f"  - {v}")
        takeover = next((r.version for r in records
                         if r.type == "session.worker_attached" and r.version > 1), None)
        console.print(next_steps(result.call_id, db_label, takeover), markup=False,
                      highlight=False)
    return verdict


def next_steps(call_id: str, db_label: str | None, takeover: int | None) -> str:
    """What to try next on the call just written: the commands a support engineer uses."""
    where = f" --db {db_label}" if db_label and db_label != "sessions.db" else ""
    steps = [f"session-store timeline {call_id}{where} --lane tools",
             f"session-store export {call_id}{where} --redact > ticket.jsonl",
             f"session-store serve{where}   (the viewer, http://127.0.0.1:8765/)"]
    if takeover:
        steps.insert(1, f"session-store state {call_id}{where} --at {takeover - 1}   "
                        "(the state the new worker took over)")
    return "next:\n" + "\n".join(f"  {step}" for step in steps)
