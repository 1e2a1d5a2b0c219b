"""Prometheus metrics (service/metrics.py) move as the call does: a real pipeline, the real
google-genai client, the local server, on SQLite and PostgreSQL; the exposition is read back
with prometheus_client's own parser.

The fleet (several workers, a SIGKILL, /metrics scraped over HTTP) is in
tests/phone_bot/test_fleet.py; here each counter is checked against the call's own log."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from pipecat.frames.frames import LLMUpdateSettingsFrame
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service import metrics, observe
from service.driver import CallDriver, now_us
from service.local_live import Audio, Call, Script, ToolCall, TurnComplete, WaitToolResponse
from rig.testing.pipeline import MODEL
from session_store import Policy
from session_store import events as ev
from session_store.errors import Fenced
from session_store.storage import observers

from .helpers import PROMPT, TOOLS, Ctl, Flavour, run_call

pytestmark = pytest.mark.timeout(90)

ORDER, WEATHER = TOOLS


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    """Every sample of the exposition, parsed by prometheus_client: (name, labels) -> value."""
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples[(f"gemini_durable_{name}", tuple(sorted(labels.items())))]


@pytest.fixture
def registry():
    reg = CollectorRegistry()
    metrics.install(reg)
    try:
        yield reg
    finally:
        metrics.uninstall()
    assert not any(isinstance(s, metrics.DurableMetrics) for s in observe.SINKS) \
        and observers.observer is None, "uninstall left a hook"


async def test_a_call_with_a_deferral_and_a_prompt_change_moves_its_metrics(store, registry):
    scripts = [
        Script([Audio(chunks=15), ToolCall(Call("c1", ORDER, {"id": 1})), Audio(chunks=10),
                TurnComplete(), WaitToolResponse("c1", timeout=3, required=False),
                Audio(chunks=2), TurnComplete()], reply=()),
        Script([WaitToolResponse("c1"), Audio(chunks=2), TurnComplete()], reply=()),
    ]
    live_during: list[float] = []

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.tap.speaking, timeout=5)
        live_during.append(value(scrape(registry), "live_calls"))
        await ctl.task.queue_frame(LLMUpdateSettingsFrame(
            delta=GeminiLiveLLMService.Settings(system_instruction="NEW")))
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=5)
        await ctl.settle()

    run = await run_call(Flavour("durable", store), scripts, drive)
    s = scrape(registry)

    assert live_during == [1.0]
    assert value(s, "live_calls") == 0
    assert value(s, "calls_started_total") == 1
    assert value(s, "calls_ended_total", reason="ended") == 1
    assert value(s, "calls_ended_total", reason="stopped") == 0
    assert value(s, "calls_taken_over_total") == 0
    assert value(s, "tool_calls_deferred_total") == len(run.find("tool.call_deferred")) == 1
    assert value(s, "tool_calls_run_total") == len(run.find("tool.call_started")) == 1
    assert value(s, "tool_calls_rerun_total") == 0
    assert value(s, "tool_calls_unknown_outcome_total") == 0
    assert value(s, "prompt_changes_total", how="reconnect") == 1
    assert value(s, "prompt_changes_total", how="context_update") == 0
    assert value(s, "results_resent_total") == 0
    assert value(s, "handshake_failures_total") == 0
    assert value(s, "fencing_refusals_total") == 0
    # Every event of the call went through one commit or another, and only those.
    assert value(s, "commit_batch_events_sum") == len(run.events)
    assert 1 <= value(s, "commit_batch_events_count") <= len(run.events)
    assert value(s, "append_seconds_count") >= value(s, "commit_batch_events_count") - 1
    assert value(s, "append_seconds_sum") > 0
    assert value(s, "event_loop_lag_seconds_count") >= 1  # the call lasted over one probe


async def test_a_takeover_counts_reruns_unknown_outcomes_resends_and_fencing(store, registry):
    """The dead worker's log: a result sent on its session and not confirmed (in doubt: sent
    again), an idempotent tool started with no outcome (re-run with its key), a tool that is
    not idempotent started with no outcome (answered "outcome unknown")."""
    call_id = "metrics-takeover"
    await store.append(call_id, [
        ev.SessionOpened(MODEL, list(TOOLS), "dead-worker", 1,
                         {"model": MODEL, "system_instruction": PROMPT}),
        ev.Connected(1, None, "x"),
        ev.ConversationMessage("user", "Hello", 1),
        ev.ToolCallRequested("c0", WEATHER, {"city": "Oslo"}, 1),
        ev.ToolCallStarted("c0", 1, f"{call_id}:c0", 1),
        ev.ToolCallCompleted("c0", {"ok": True}),
        ev.ToolResultSending("c0", 1, "tool_response"),
        ev.ToolCallRequested("c1", ORDER, {"id": 1}, 1),
        ev.ToolCallStarted("c1", 1, f"{call_id}:c1", 1),
        ev.ToolCallRequested("c2", WEATHER, {"city": "Rome"}, 1),
        ev.ToolCallStarted("c2", 1, f"{call_id}:c2", 1),
    ], 0, epoch=1, recorded_at_us=now_us())

    def settled(state) -> bool:  # (the state before the attach has no calls at all)
        return set(state.calls) == {"c0", "c1", "c2"} and all(
            c.has_outcome and c.sends and c.sends[-1].confirmed for c in state.calls.values())

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: settled(ctl.llm.driver.state), timeout=15), \
            (ctl.server.violations, ctl.server.errors)
        await ctl.settle()

    run = await run_call(Flavour("durable", store), Script([], reply=()), drive,
                         call_id=call_id, policy=Policy(idempotent={ORDER}))
    # The dead worker comes back and appends with its old epoch: refused.
    with pytest.raises(Fenced):
        await store.append(call_id, [ev.ConversationMessage("user", "late", 1)],
                           run.state.version, epoch=1)
    s = scrape(registry)

    assert run.state.calls["c1"].attempt == 2 and run.state.calls["c2"].outcome_unknown
    assert value(s, "calls_started_total") == 0
    assert value(s, "calls_taken_over_total") == 1
    assert value(s, "calls_ended_total", reason="ended") == 1
    assert value(s, "live_calls") == 0
    assert value(s, "tool_calls_run_total") == 0
    assert value(s, "tool_calls_rerun_total") == 1
    assert value(s, "tool_calls_unknown_outcome_total") == 1
    resent = [e for e in run.find("tool.result_sending", call_id="c0")
              if e.data["generation"] > 1]
    assert value(s, "results_resent_total") == len(resent) == 1, run.timeline()
    assert value(s, "fencing_refusals_total") == 1


async def test_handshake_failures_give_ups_and_context_updates_are_read_from_the_log(
        store, registry):
    """The facts the link and the effects log for them (service/link.py, effects.py), through
    a real driver and store; a worker fenced out and a pipeline stopped with its call open
    leave the live gauge."""
    driver = CallDriver(store, "metrics-anomalies")
    await driver.attach(model=MODEL, tools=[], settings={})
    await driver.record(ev.AnomalyRecorded("handshake_failed", {"error": "1011"}, 0),
                        ev.AnomalyRecorded("handshake_failed", {"error": "1011"}, 0),
                        ev.AnomalyRecorded("connection_given_up", {"failures": 3}, 0),
                        ev.ContextSent(1, 1))
    other = CallDriver(store, "metrics-anomalies")
    await other.attach(model=MODEL, tools=[], settings={})
    s = scrape(registry)
    assert value(s, "handshake_failures_total") == 2
    assert value(s, "connections_given_up_total") == 1
    assert value(s, "prompt_changes_total", how="context_update") == 1
    assert value(s, "calls_started_total") == value(s, "calls_taken_over_total") == 1
    assert value(s, "live_calls") == 2  # (one process holding both: the old one is not told)

    with pytest.raises(Fenced):
        await driver.record(ev.ConversationMessage("user", "late", 0))
    observe.left(driver, "taken_over")
    observe.left(driver, "taken_over")  # told twice (on_fenced, then cleanup): counted once
    observe.left(other, "stopped")
    s = scrape(registry)
    assert value(s, "fencing_refusals_total") == 1
    assert value(s, "calls_ended_total", reason="taken_over") == 1
    assert value(s, "calls_ended_total", reason="stopped") == 1
    assert value(s, "live_calls") == 0


def test_no_call_id_in_any_label(registry):
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        assert family.name.startswith("gemini_durable_")
        for sample in family.samples:
            assert set(sample.labels) <= {"reason", "how", "le"}, sample


def test_the_alert_rules_and_the_dashboard_name_only_metrics_the_service_exposes(registry):
    """examples/phone_bot/alerts.yml and grafana/dashboard.json against the exposition: a
    renamed metric would leave an alert that never fires and an empty panel."""
    exposed = {s.name for family in text_string_to_metric_families(
        generate_latest(registry).decode()) for s in family.samples}
    # Histogram series appear once observed: their names, from the families.
    exposed |= {f"{f.name}_bucket" for f in text_string_to_metric_families(
        generate_latest(registry).decode()) if f.type == "histogram"}
    root = Path(__file__).resolve().parents[2] / "examples" / "phone_bot"
    rules = yaml.safe_load((root / "alerts.yml").read_text())["groups"][0]["rules"]
    panels = json.loads((root / "grafana" / "dashboard.json").read_text())["panels"]
    exprs = [r["expr"] for r in rules] + [t["expr"] for p in panels for t in p["targets"]]
    named = {n for e in exprs for n in re.findall(r"gemini_durable_\w+", e)}
    assert named - exposed == set()
    assert len(rules) == 7 and len(panels) == 9
    # Every metric is on the dashboard (a histogram by its buckets or its sum).
    families = {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())
                if not f.name.endswith("_created")}  # (prometheus_client's creation times)
    shown = {f for f in families if any(n == f or n.startswith(f + "_") for n in named)}
    assert families - shown == set()
