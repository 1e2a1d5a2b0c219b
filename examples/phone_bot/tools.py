"""The bot's two tools. Each writes its side effect to a ledger file, one JSON line per run,
so a check can tell afterwards whether a tool ran twice (examples/phone_bot/fleet.py does).

- `refund_order` moves money: it is NOT idempotent. Run twice, it refunds twice; after a
  crash in the middle of it the service does not run it again, it tells the model the
  outcome is unknown.
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

IDEMPOTENT = frozenset({"send_receipt"})

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


def register_tools(llm, ledger: Ledger, *, latency_s: float = 0.4) -> None:
    """Register both tools on a DurableGeminiLiveLLMService. `latency_s` stands in for the
    provider's round trip (the window in which a crash leaves the call in doubt)."""

    async def refund_order(params: FunctionCallParams) -> None:
        order_id = params.arguments.get("order_id")
        ledger.write({"tool": "refund_order", "call_id": params.tool_call_id,
                      "args": params.arguments, "idempotency_key": None,
                      "pid": os.getpid(), "at": time.time()})
        await asyncio.sleep(latency_s)
        await params.result_callback({"order_id": order_id, "refunded": True,
                                      "amount": "59.90 EUR"})

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
