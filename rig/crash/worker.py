"""One worker process of the crash harness: runs (or resumes) a scripted call, may die.

Started by the harness as a real process (multiprocessing `forkserver` with pipecat
preloaded, or `python -m rig.crash.worker CONFIG_JSON`). Kill points, for the
every-boundary mode, are real SIGKILLs the process sends itself: right after the append
that brings the log to a given version, or inside a tool between its side effect (written
to the ledger) and the append of its outcome.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass

from pipecat.frames.frames import FunctionCallResultProperties, LLMUpdateSettingsFrame

from rig.crash.scenarios import PROMPT, SCENARIOS, live_complete, scenario_complete
from service.gemini_live import CannotTell, Done, DurableGeminiLiveLLMService, NotDone
from service.local_live import http_options
from rig.testing.pipeline import MODEL, ToolLedger, run_pipeline, tools_schema
from session_store import Policy, load_state, open_store

# How long the call must stay complete, as the log says, before the worker ends it.
COMPLETE_FOR_S = 0.25
# How long a worker dying in a commit (`kill_before_event`) lets the rest of it run first.
BEFORE_COMMIT_S = 0.3


@dataclass
class WorkerConfig:
    db_url: str
    call_id: str
    scenario: str
    base_url: str | None  # None: the real Gemini Live API (the live demo)
    cert_path: str | None
    ledger_path: str
    schema: str | None = None
    kill_at_version: int | None = None  # SIGKILL right after the log reaches this version
    kill_in_tool: str | None = None  # SIGKILL after this tool's side effect, before its outcome
    kill_after_event: str | None = None  # SIGKILL right after appending an event of this type
    # SIGKILL while the first append holding an event of this type commits, before it does:
    # anything done ahead of its commit (a tool run before its start is logged) shows then.
    kill_before_event: str | None = None
    # Where the worker writes, right before a planned SIGKILL, where it died: the harness
    # checks that the kill it planned really fired (and where).
    kill_record: str | None = None
    timeout_s: float = 60.0
    # Live mode: the key is read from GOOGLE_API_KEY in the worker (never put in a config,
    # a file or the log), the model decides which tools to call, and the call is complete
    # when everything it asked for has reached it (rig.crash.scenarios.live_complete).
    live: bool = False
    model: str | None = None
    # Snapshot every few events (the product default is 500): every takeover in the harness
    # then starts from a compacted snapshot, and a fresh session from the whole log.
    snapshot_every: int = 6
    # The pipeline traces the call (pipecat's enable_tracing, the call id as conversation
    # id): the service's decisions become spans (service/tracing.py). `trace_file`: this
    # process also exports every span there as it ends, a JSON object a line (a SIGKILL
    # keeps what was exported); needs opentelemetry-sdk.
    trace: bool = False
    trace_file: str | None = None


def _die(cfg: WorkerConfig, where: str) -> None:
    if cfg.kill_record:
        with open(cfg.kill_record, "w", encoding="utf-8") as f:
            f.write(where)
    os.kill(os.getpid(), signal.SIGKILL)


async def run_worker(cfg: WorkerConfig) -> None:
    scenario = SCENARIOS[cfg.scenario]
    store = await open_store(cfg.db_url, **({"schema": cfg.schema} if cfg.schema else {}))
    if (await load_state(store, cfg.call_id)).closed:
        # The worker before died after the call ended: nothing left to do (the service would
        # refuse the call at setup with CallClosed, and open no session).
        await store.close()
        return
    if cfg.kill_at_version is not None or cfg.kill_after_event is not None \
            or cfg.kill_before_event is not None:
        append = store.append

        async def append_then_maybe_die(stream_id, events, expected_version, **kw):
            types = ", ".join(e.TYPE for e in events)
            if any(e.TYPE == cfg.kill_before_event for e in events):
                # A commit takes a few ms (the worker may die in it): give what wrongly ran
                # ahead of it the time to leave its trace (a ledger line, a send).
                await asyncio.sleep(BEFORE_COMMIT_S)
                _die(cfg, f"died at v{expected_version}, committing {types}")
            version = await append(stream_id, events, expected_version, **kw)
            if (cfg.kill_at_version is not None and version >= cfg.kill_at_version) \
                    or any(e.TYPE == cfg.kill_after_event for e in events):
                _die(cfg, f"died at v{version}, after {types}")
            return version

        store.append = append_then_maybe_die
    ledger = ToolLedger(cfg.ledger_path)
    api_key = os.environ.get("GOOGLE_API_KEY", "") if cfg.live else "local-test-key"
    connection = {"http_options": http_options(cfg.base_url, cfg.cert_path)} \
        if cfg.base_url else {}
    llm = DurableGeminiLiveLLMService(
        api_key=api_key,
        settings=DurableGeminiLiveLLMService.Settings(
            model=cfg.model or MODEL, system_instruction=scenario.prompt or PROMPT),
        tools=tools_schema(scenario.tool_names, scenario.tool_descriptions),
        store=store, call_id=cfg.call_id, policy=Policy(idempotent=scenario.idempotent),
        snapshot_every=cfg.snapshot_every, **connection)
    complete = live_complete(scenario) if cfg.live else \
        (lambda state: scenario_complete(scenario, state))

    def make_handler(name: str):
        async def handler(params) -> None:
            ledger.write({"tool": name, "call_id": params.tool_call_id, "args": params.arguments,
                          "idempotency_key": llm.idempotency_key(params.tool_call_id),
                          "pid": os.getpid(), "at": time.time()})
            if cfg.kill_in_tool == name:
                _die(cfg, f"died in {name} ({params.tool_call_id}), after its side effect")
            for step in range(1, scenario.progress.get(name, 0) + 1):
                await asyncio.sleep(scenario.tool_delay_s)
                await params.result_callback(
                    {"tool": name, "step": step},
                    properties=FunctionCallResultProperties(is_final=False, run_llm=False))
            await asyncio.sleep(scenario.tool_delay_s)
            await params.result_callback({"ok": True, "tool": name, "args": params.arguments,
                                          **scenario.tool_results.get(name, {})})
        return handler

    for name in scenario.tool_names:
        llm.register_function(name, make_handler(name),
                              cancel_on_interruption=name not in scenario.progress)
    for name in scenario.checked:
        llm.register_outcome_check(name, ledger_check(cfg.ledger_path, name, scenario),
                                   rerun_if_not_done=scenario.rerun_if_not_done)

    async def control(task) -> None:
        complete_since = None
        while True:
            state = llm.driver.state
            if llm.driver.fenced:
                return
            changed = state.settings.get("system_instruction") == scenario.new_prompt
            if scenario.new_prompt and state.bot_speaking and not changed:
                # The app changes the prompt mid-turn; the log remembers it was done.
                await task.queue_frame(LLMUpdateSettingsFrame(
                    delta=DurableGeminiLiveLLMService.Settings(system_instruction=scenario.new_prompt)))
                while llm.driver.state.settings.get("system_instruction") != scenario.new_prompt:
                    await asyncio.sleep(0.02)
            # Complete only when nothing observed is still waiting to be logged (a toolCall
            # received but not yet appended would otherwise be left unanswered), and only
            # once it stayed complete for COMPLETE_FOR_S: a new session's toolCall may still
            # be on its way, or in the receive loop behind its audio (seen: a call ended
            # 50 ms after a reconnect, its repeated toolCall started and never answered).
            if complete(state) and not llm.driver.has_notes:
                now = time.monotonic()
                complete_since = complete_since or now
                if now - complete_since >= COMPLETE_FOR_S:
                    return
            else:
                complete_since = None
            await asyncio.sleep(0.05)

    if cfg.trace_file:
        _export_spans(cfg.trace_file)
    try:
        await run_pipeline(llm, control=control, timeout=cfg.timeout_s,
                           initial_messages=[{"role": "user", "content": scenario.user_turn}],
                           worker_options={"enable_tracing": True, "conversation_id": cfg.call_id}
                           if cfg.trace else None)
    finally:
        await store.close()


def ledger_check(path: str, name: str, scenario):
    """An outcome check that asks the ledger (the system the tool acts on) whether it has
    a run of `name` with this idempotency key: its result if so (as the tool answers)."""
    def check(key: str, args: dict):
        if scenario.unsure:
            return CannotTell("the ledger cannot be asked")
        runs = [json.loads(line) for line in open(path, encoding="utf-8")] \
            if os.path.exists(path) else []
        if any(r["tool"] == name and r["idempotency_key"] == key for r in runs):
            return Done({"ok": True, "tool": name, "args": args,
                         **scenario.tool_results.get(name, {})})
        return NotDone()
    return check
def _export_spans(path: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider()
    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - the process's, until it dies
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=out, formatter=lambda span: span.to_json(indent=None) + "\n")))
    trace.set_tracer_provider(provider)


def main(cfg: WorkerConfig | dict) -> None:
    if isinstance(cfg, dict):
        cfg = WorkerConfig(**cfg)
    asyncio.run(run_worker(cfg))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))


__all__ = ["WorkerConfig", "main", "run_worker", "asdict"]
