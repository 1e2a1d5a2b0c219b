"""The phone bot's `refund_order` (not idempotent) and its outcome check, with a real SIGKILL
(issue #32, item 8): two uvicorn workers of examples/phone_bot on one database (SQLite, and
PostgreSQL in a private schema), a call through the Twilio stand-in, the local Gemini Live
server. The worker serving the call is killed inside refund_order, before the refund is
made (its start is logged, the ledger has nothing) or after (the ledger has the refund, the
log has no outcome). The call goes on on the other worker, whose check asks the ledger by
the idempotency key: after, the model is told the refund the provider made; before, the
refund is made now, with the same key. Never "outcome unknown", never twice. The verdict is
the fleet's (examples/phone_bot/fleet.py: I1-I8, the ledger, the server's record)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid

import httpx
import pytest

from examples.phone_bot import fleet
from examples.phone_bot.fleet import PUBLIC_URL, ROOT, Kill
from examples.phone_bot.gemini_script import PhoneCallPlan
from examples.phone_bot.telephony import Balancer, PhoneCall
from examples.phone_bot.tools import Ledger
from rig.crash.harness import Databases
from service.local_live import LocalLiveServer
from session_store import open_store

pytestmark = pytest.mark.timeout(240)

REFUND = "refund_order"
# The provider's round trip: 1 s before the refund is made, 1 s after (tools.py), wide
# windows for a kill watching the log and the ledger from outside.
LATENCY_S = "2.0"


async def _kill_in_refund(call: PhoneCall, kill: Kill, workers, url, schema,
                          ledger: Ledger) -> None:
    """SIGKILL the worker serving `call` once refund_order's start is logged ("before") or
    once the ledger has the refund ("after")."""
    store = await open_store(url, **({"schema": schema} if schema else {}))
    try:
        started = None
        while started is None:
            assert call.status != "completed" and not call.error, "the call ended first"
            started = next((r for r in await store.read(call.call_sid)
                            if r.type == "tool.call_started"
                            and r.data["call_id"].startswith(REFUND)), None)
            await asyncio.sleep(0.02)
        key = started.data["idempotency_key"]
        while kill.after == "after" and ledger.find(REFUND, key) is None:
            await asyncio.sleep(0.01)
        victim = next(w for w in workers if w.url == call.streams[-1].worker)
        kill.worker, kill.pid, kill.affected = victim.index, victim.pid, [call.call_sid]
        kill.at = time.time()
        victim.process.send_signal(signal.SIGKILL)
        kill.point = f"{REFUND}: refund {'made' if ledger.find(REFUND, key) else 'not made'}"
    finally:
        kill.over = True
        await store.close()


async def _call_killed_in_refund(db: str, point: str, workdir):
    databases = Databases(db, workdir)
    url, schema = await databases()
    ledger_path = workdir / "tool-ledger.jsonl"
    ledger = Ledger(ledger_path)
    token = uuid.uuid4().hex
    plan = PhoneCallPlan()
    try:
        async with LocalLiveServer(plan.script) as gemini:
            env = {**os.environ, "DATABASE_URL": url, "DATABASE_SCHEMA": schema or "",
                   "PUBLIC_URL": PUBLIC_URL, "TWILIO_AUTH_TOKEN": token,
                   "GEMINI_BASE_URL": gemini.base_url, "GEMINI_CA_CERT": str(gemini.cert_path),
                   "TOOL_LEDGER": str(ledger_path), "TOOL_LATENCY_S": LATENCY_S,
                   "LOGURU_LEVEL": "INFO",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                               os.environ.get("PYTHONPATH")]))}
            workers = await fleet._start_workers(2, env, workdir)  # noqa: SLF001 - the rig
            try:
                balancer = Balancer(PUBLIC_URL, [w.url for w in workers])
                kill: Kill

                def hang_up_when(call: PhoneCall) -> bool:
                    closing = plan.closing_sent.get(call.from_number)
                    stream = call.streams[-1]
                    return (kill.over and closing is not None and bool(stream.media)
                            and stream.media[-1][0] > closing
                            and time.time() - stream.media[-1][0] > fleet.HANG_UP_AFTER_QUIET_S)

                call = PhoneCall(balancer, f"{PUBLIC_URL}/twiml", "+15550001042",
                                 hang_up_when=hang_up_when, auth_token=token)
                kill = Kill(call.call_sid, REFUND, point, 0.0)
                async with httpx.AsyncClient(timeout=10) as http:
                    running = asyncio.create_task(call.run(http))
                    await _kill_in_refund(call, kill, workers, url, schema, ledger)
                    await asyncio.wait_for(running, 120)
                (outcome,) = await fleet._judge([call], kill, workers, gemini, plan,  # noqa: SLF001 - the rig
                                                url, schema, ledger_path)
            finally:
                await fleet._stop_workers(workers)  # noqa: SLF001 - the rig
        store = await open_store(url, **({"schema": schema} if schema else {}))
        try:
            records = await store.read(call.call_sid)
        finally:
            await store.close()
    finally:
        await databases.cleanup()
    where = f"workdir {workdir}, killed at {kill.point}"
    assert not outcome.problems, "\n".join([where, *outcome.problems])
    assert outcome.gap_s is not None, f"{where}: the caller heard nothing after the kill"
    refunds = [e for e in _entries(ledger_path) if e["tool"] == REFUND]
    assert len(refunds) == 1, f"{where}: refunded {len(refunds)} times"
    assert not [r for r in records if r.type == "tool.call_failed"], where
    return kill, records, refunds[0]


def _entries(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _data(records, etype: str) -> list[dict]:
    return [r.data for r in records if r.type == etype]


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_killed_after_the_refund_the_caller_is_told_it_was_made(db, tmp_path):
    kill, records, refund = await _call_killed_in_refund(db, "after", tmp_path)
    assert kill.point.endswith("refund made"), kill.point
    assert [c["answer"] for c in _data(records, "tool.outcome_checked")] == ["done"]
    refunded = [c for c in _data(records, "tool.call_completed")
                if c["call_id"].startswith(REFUND) and c.get("reused_from") is None]
    # (A model that asks again after the takeover is answered from that record: reused_from.)
    assert [c["result"] for c in refunded] == [refund["result"]]
    assert refund["pid"] == kill.pid  # made by the killed worker, once
    print(f"\n{db}: {kill.point}; the takeover's check said done; audio back after the kill")


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_killed_before_the_refund_it_is_made_once_with_its_key(db, tmp_path):
    kill, records, refund = await _call_killed_in_refund(db, "before", tmp_path)
    assert kill.point.endswith("refund not made"), kill.point
    assert [c["answer"] for c in _data(records, "tool.outcome_checked")] == ["not_done"]
    starts = [s for s in _data(records, "tool.call_started") if s["call_id"].startswith(REFUND)]
    assert [s["attempt"] for s in starts] == [1, 2]
    assert {s["idempotency_key"] for s in starts} == {refund["idempotency_key"]}
    assert refund["pid"] != kill.pid  # made by the worker that took the call over
