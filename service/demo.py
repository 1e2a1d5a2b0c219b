"""The demo call (placeholder until the crash-recovery demo lands).

Drives one scripted call through the pure core and the durable log on SQLite: the bot speaks,
a tool call arrives mid-speech and is deferred, the prompt changes mid-turn (reconnect
buffered), the bot stops, the deferred call runs, its result is delivered, the buffered
reconnect happens. Prints the timeline and a verdict. No pipecat pipeline yet.
"""

from __future__ import annotations

import time
import uuid

from rich.console import Console

from session_store import Policy, decide, due, load_state, open_store
from session_store.decide import (FunctionCall, Reconnect, SendResult, SettingsUpdate,
                                  SpeechStarted, SpeechStopped, StartCall, ToolCallsArrived)
from session_store import events as ev
from session_store.migrate import upgrade

console = Console()


async def run_demo(db: str, quiet: bool = False) -> dict:
    await upgrade(db)
    store = await open_store(db)
    call_id = f"demo-{uuid.uuid4().hex[:8]}"
    policy = Policy()
    version = 0

    async def record(*events):
        nonlocal version
        version = await store.append(call_id, list(events), version)

    async def observe(obs):
        state = await load_state(store, call_id)
        events = decide(state, obs, policy)
        if events:
            await record(*events)

    try:
        await record(ev.SessionOpened("demo-model", ["lookup_order"], "worker-1"),
                     ev.Connected(1))
        await observe(SpeechStarted(1))
        await observe(ToolCallsArrived((FunctionCall("c1", "lookup_order", {"id": 42}),), 1))
        await observe(SettingsUpdate(("system_instruction",), {}, needs_reconnect=True))
        await observe(SpeechStopped(1))
        for _ in range(5):  # perform what is due until nothing is
            state = await load_state(store, call_id)
            effects = due(state, policy, time.time_ns() // 1000)
            if not effects:
                break
            for effect in effects:
                match effect:
                    case StartCall():
                        await record(ev.ToolCallStarted(effect.call_id, effect.attempt,
                                                        effect.idempotency_key, state.epoch),
                                     ev.ToolCallCompleted(effect.call_id, {"status": "shipped"}))
                    case SendResult():
                        await record(ev.ToolResultSending(effect.call_id, state.generation,
                                                          effect.via),
                                     ev.ToolResultSent(effect.call_id, state.generation,
                                                       effect.via))
                    case Reconnect():
                        await record(ev.Disconnected(state.generation, effect.reason),
                                     ev.Connected(state.generation + 1))
                break  # re-read the state after each effect, as the service does
        await record(ev.SessionClosed())
        final = await load_state(store, call_id)
        reports = await store.verify(call_id)
        if not quiet:
            for rec in await store.read(call_id):
                console.print(f"  {rec.version:3}  {rec.type:28} {rec.data_json}",
                              markup=False, highlight=False)
        unanswered = [c.call_id for c in final.unanswered()]
        verdict = {"ok": not unanswered and all(r.ok for r in reports), "call": call_id,
                   "violations": [f"unanswered call {c}" for c in unanswered],
                   "events": final.version, "kills": 0,
                   "chain_verified": all(r.ok for r in reports)}
        if not quiet:
            console.print(f"verdict: {'OK' if verdict['ok'] else 'FAILED'} — every call answered "
                          f"exactly once: {not unanswered}; chain verified: "
                          f"{verdict['chain_verified']}")
        return verdict
    finally:
        await store.close()
