"""The demo call: offline, on SQLite, with a real crash in the middle.

A real pipecat pipeline with DurableGeminiLiveLLMService talks to the local Gemini Live
server (TLS websockets, the real google-genai client). The bot speaks; a tool call arrives
mid-speech and is deferred; the app changes the prompt mid-turn (the reconnect waits for
the turn to end); the worker process is SIGKILLed while a tool result is in flight; a new
worker process takes the call over from the log and finishes it. Then the call is checked
against the server's record, the tools' side-effect ledger and the log (I1–I7), and its
timeline and verdict are printed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console

from service.crash.harness import Kill, run_case
from session_store import open_store
from session_store.migrate import upgrade

console = Console()


async def run_demo(db: str, quiet: bool = False) -> dict:
    await upgrade(db)
    with tempfile.TemporaryDirectory(prefix="session-store-demo-") as tmp:
        if not quiet:
            console.print("[bold]demo call[/bold]: bot speaks, a tool call arrives mid-speech, "
                          "the prompt changes mid-turn, the worker is killed while a result is "
                          "in flight, a new worker takes over…")
        result = await run_case("prompt_change", db, workdir=Path(tmp),
                                kills=[Kill(after_event="tool.result_sending")])
    store = await open_store(db)
    try:
        records = await store.read(result.call_id)
        chain_ok = all(r.ok for r in await store.verify(result.call_id))
    finally:
        await store.close()
    verdict = {"ok": result.ok and chain_ok, "call": result.call_id,
               "violations": result.violations, "events": len(records), "kills": result.kills,
               "workers": result.workers, "chain_verified": chain_ok,
               "takeover_s": [round(t, 3) for t in result.takeover_s]}
    if not quiet:
        from session_store.audit.text import timeline_view
        from session_store.audit.timeline import build_timeline

        console.print(timeline_view(build_timeline(records, call_id=result.call_id)))
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
    return verdict
