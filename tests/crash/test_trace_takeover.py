"""A crash and its recovery in the call's OpenTelemetry traces (service/tracing.py).

A worker process runs a call with pipecat's tracing on, exporting each span to a file as it
ends, and is SIGKILLed inside an idempotent tool, after its side effect; a second worker, in
this process, takes the call over with pipecat's tracing on and the SDK's in-memory
exporter. Its trace holds the takeover (epoch 2, the tool call found in doubt) and the re-run
with the first run's idempotency key, under pipecat's conversation span; both workers' spans
carry the call id as `conversation.id`. Real processes, pipeline, google-genai client and
local server; SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rig.crash.scenarios import SCENARIOS, ServerPlan
from service import observe
from rig.crash.worker import WorkerConfig, run_worker
from service.local_live import LocalLiveServer

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = "idempotent_tool"
TOOL = "send_receipt"  # idempotent: in doubt, it is re-run with its key


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """This process's spans, in memory (the global provider can be set once per process)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def _attributes(span) -> dict:
    return dict(span.attributes or {})


async def test_a_takeover_after_a_sigkill_is_in_the_calls_trace(migrated, tmp_path, exporter):
    exporter.clear()
    schema = migrated.options.get("schema")
    call_id = f"trace-{os.getpid()}-{tmp_path.name[-12:]}"
    ledger, dead_spans = tmp_path / "ledger.jsonl", tmp_path / "worker1.spans.jsonl"
    async with LocalLiveServer(ServerPlan(SCENARIOS[SCENARIO]).script) as server:
        def config(**extra) -> WorkerConfig:
            return WorkerConfig(migrated.url, call_id, SCENARIO, server.base_url,
                                str(server.cert_path), str(ledger), schema=schema,
                                trace=True, timeout_s=40, **extra)

        with (tmp_path / "worker1.log").open("wb") as log:
            first = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "rig.crash.worker",
                json.dumps(asdict(config(kill_in_tool=TOOL, trace_file=str(dead_spans)))),
                cwd=ROOT, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
            assert await asyncio.wait_for(first.wait(), 60) == -9, \
                (tmp_path / "worker1.log").read_text()[-3000:]
        await run_worker(config())

    runs = [json.loads(line) for line in ledger.read_text().splitlines()]
    first_run = next(r for r in runs if r["tool"] == TOOL)
    key = first_run["idempotency_key"]

    # The dead worker's spans, exported before the kill (its conversation span, still open
    # then, died with it): the call opened, the tool run, children of that conversation.
    before = [json.loads(line) for line in dead_spans.read_text().splitlines()]
    mine = [s for s in before if s["attributes"].get("conversation.id") == call_id]
    assert {s["name"] for s in mine} >= {"durable.call_opened", "durable.tool_run"}, \
        [s["name"] for s in before]
    run1 = next(s for s in mine if s["name"] == "durable.tool_run"
                and s["attributes"]["gen_ai.tool.name"] == TOOL)
    assert run1["attributes"]["durable.idempotency_key"] == key
    assert run1["attributes"]["durable.attempt"] == 1
    assert run1["parent_id"] and run1["context"]["trace_id"] == mine[0]["context"]["trace_id"]

    # The new worker's trace: the takeover, then the re-run with the same key.
    spans = [s for s in exporter.get_finished_spans()
             if _attributes(s).get("conversation.id") == call_id]
    by_name = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    takeover, = by_name["durable.takeover"]
    attrs = _attributes(takeover)
    assert attrs["durable.takeover_epoch"] == 2 and attrs["durable.epoch"] == 2
    assert first_run["call_id"] in attrs["durable.in_doubt"]
    rerun = [s for s in by_name["durable.tool_run"] if _attributes(s)["durable.rerun"]]
    assert [(_attributes(s)["gen_ai.tool.call.id"], _attributes(s)["durable.idempotency_key"],
             _attributes(s)["durable.attempt"]) for s in rerun] == \
        [(first_run["call_id"], key, 2)]
    assert rerun[0].start_time >= takeover.start_time
    # All in pipecat's conversation trace of this worker (a child of its conversation span,
    # or of one of its turns), which is a new trace: the dead worker's ended with it.
    conversation, = by_name["conversation"]
    trace_id = conversation.context.trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}
    assert takeover.parent is not None and takeover.parent.trace_id == trace_id
    assert format(trace_id, "032x") != mine[0]["context"]["trace_id"].removeprefix("0x")
    assert by_name["durable.call_left"] and \
        _attributes(by_name["durable.call_left"][-1])["durable.reason"] == "ended"
    # The call is over: the tracer no longer listens, commits pay nothing for it again.
    assert not observe.SINKS
