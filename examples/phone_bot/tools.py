"""The bot's two tools. Each writes its side effect to a ledger file, one JSON line per run,
so a check can tell afterwards whether a tool ran twice (examples/phone_bot/fleet.py does).

- `refund_order` moves money: it is NOT idempotent. Run twice, it refunds twice. It passes
  the call's idempotency key to the refund provider, which can be asked afterwards whether a
  refund with that key went through: after a crash in the middle of it, the worker that
  takes the call over asks (its outcome check) and tells the model what really happened,
  or runs it again, with the same key, if the provider has no such refund.
- `send_receipt` is idempotent: it passes the call's idempotency key to the mail provider,
  which sends one mail per key. After a crash in the middle of it the service runs it
  again with the same key.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.services.llm_service import FunctionCallParams

from service.gemini_live import Done, NotDone

IDEMPOTENT = frozenset({"send_receipt"})
CHECKED = frozenset({"refund_order"})  # tools with an outcome check

TOOLS = ToolsSchema(standard_tools=[
    FunctionSchema(name="refund_order", description="Refund an order in full.",
                   properties={"order_id": {"type": "integer"}}, required=["order_id"]),
    FunctionSchema(name="send_receipt", description="Mail the caller the receipt of an order.",
                   properties={"order_id": {"type": "integer"}}, required=["order_id"]),
])


class Ledger:
    """The side effects, appended to a JSON Lines file (opened per write: several worker
    processes share it, and a line must be on disk before the tool answers)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def write(self, entry: dict) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def find(self, tool: str, key: str) -> dict | None:
        """The run of `tool` with idempotency key `key`, if the ledger has one."""
        if not self.path.exists():
            return None
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                entry = json.loads(line)
                if entry.get("tool") == tool and entry.get("idempotency_key") == key:
                    return entry
        return None


def register_tools(llm, ledger: Ledger, *, latency_s: float = 0.4) -> None:
    """Register both tools on a DurableGeminiLiveLLMService, and refund_order's outcome
    check. `latency_s` stands in for the provider's round trip (the window in which a crash
    leaves the call in doubt): half of it before the refund is made, half after."""

    async def refund_order(params: FunctionCallParams) -> None:
        order_id = params.arguments.get("order_id")
        key = params.llm.idempotency_key(params.tool_call_id)
        result = {"order_id": order_id, "refunded": True, "amount": "59.90 EUR"}
        await asyncio.sleep(latency_s / 2)  # the request on its way to the provider
        ledger.write({"tool": "refund_order", "call_id": params.tool_call_id,
                      "args": params.arguments, "idempotency_key": key, "result": result,
                      "pid": os.getpid(), "at": time.time()})
        await asyncio.sleep(latency_s / 2)  # its answer on its way back
        await params.result_callback(result)

    def refund_made(key: str, _args: dict):
        # The provider knows every refund by its key: done (with what it answered) or not.
        # (A provider that can be unreachable answers CannotTell then.)
        entry = ledger.find("refund_order", key)
        return Done(entry["result"]) if entry is not None else NotDone()

    async def send_receipt(params: FunctionCallParams) -> None:
        # The same key on every run of this call: a re-run after a crash sends no second mail.
        key = params.llm.idempotency_key(params.tool_call_id)
        ledger.write({"tool": "send_receipt", "call_id": params.tool_call_id,
                      "args": params.arguments, "idempotency_key": key,
                      "pid": os.getpid(), "at": time.time()})
        await asyncio.sleep(latency_s)
        await params.result_callback({"order_id": params.arguments.get("order_id"),
                                      "receipt_sent": True})

    llm.register_function("refund_order", refund_order)
    llm.register_function("send_receipt", send_receipt)
    # Not done: the provider never saw the refund, so making it now (same key) is safe.
    llm.register_outcome_check("refund_order", refund_made, rerun_if_not_done=True)
