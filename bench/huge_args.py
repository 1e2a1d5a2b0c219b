"""What a tool call with huge arguments costs a live call (hostile wire).

One scripted call per size through a real pipecat pipeline, our service, the real
google-genai client and the local server: 30 audio chunks, a toolCall whose arguments are
one string of SIZE bytes, 30 more chunks (20 ms apart, as a server streams them), then the
answer. Printed per database and size:

- stall: how much later than the server sent it the first audio chunk after the toolCall
  reached the service's message handler, compared with the chunk before (parsing and noting
  the call on the receive loop: what the audio path waits for);
- logged: toolCall sent → `tool.call_requested` committed (the log's append of it);
- answered: toolCall sent → `tool.result_sent` committed.

Up to Policy.max_args_bytes (1 MiB) the call runs with its arguments; over it, it is refused
with an explicit error and a bounded stand-in (so the log never holds them).

    python bench/huge_args.py            # 0.1, 0.9, 5, 15 MB; SQLite and PostgreSQL
    python bench/huge_args.py --quick    # 0.9 and 5 MB, SQLite
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid


from loguru import logger

from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.gemini_live import DurableGeminiLiveLLMService
from service.local_live import (Audio, Call, LocalLiveServer, Script, ToolCall,
                                TurnComplete, WaitToolResponse)
from rig.testing.pipeline import MODEL, ToolLedger, make_tool, run_pipeline, tools_schema
from session_store import open_store
from session_store.storage.migrate import upgrade

PG_URL = os.environ.get("SESSION_STORE_BENCH_PG",
                        "postgresql+asyncpg://postgres@127.0.0.1:5432/test")

handled: list[tuple[float, str]] = []  # (wall time, message kind) as the service got them
_original = DurableGeminiLiveLLMService._handle_server_message


async def _timed(self, message):
    kind = "tool_call" if message.tool_call else (
        "audio" if message.server_content and message.server_content.model_turn else "other")
    handled.append((time.time(), kind))
    await _original(self, message)


async def logged_at(store, call_id: str, type_: str, timeout: float) -> float:
    """When `type_` was committed to the call's log (wall seconds), waiting for it."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in await store.read(call_id) if e.type == type_]
        if found:
            return found[0].recorded_at_us / 1e6
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {type_} in {call_id}'s log after {timeout} s")
        await asyncio.sleep(0.05)


async def one(store, size: int) -> tuple[float, float, float]:
    """One call with a toolCall of `size` bytes of arguments: (stall, logged, answered) ms."""
    handled.clear()
    script = Script([Audio(chunks=30, pause_ms=20), ToolCall(Call("h", "lookup_order",
                                                                  {"blob": "x" * size})),
                     Audio(chunks=30, pause_ms=20), TurnComplete(), WaitToolResponse("h", 20),
                     Audio(chunks=2), TurnComplete()], reply=())
    call_id = f"huge-{uuid.uuid4().hex[:8]}"
    # The script starts once the client's opening content arrived, as a real model does.
    async with LocalLiveServer([script], hold_until_input=2.0) as server:
        llm = DurableGeminiLiveLLMService(
            api_key="bench", http_options=server.http_options(), store=store, call_id=call_id,
            settings=GeminiLiveLLMService.Settings(model=MODEL, system_instruction="Be brief."),
            tools=tools_schema(["lookup_order"]))
        llm.register_function("lookup_order", make_tool("lookup_order", ToolLedger()))

        async def answered() -> None:
            deadline = time.monotonic() + 60
            while not any(r.id == "h" for r in server.tool_responses()):
                if time.monotonic() > deadline or server.violations:
                    raise TimeoutError(f"no answer to the toolCall: {server.violations}")
                await asyncio.sleep(0.02)
            await logged_at(store, call_id, "tool.result_sent", timeout=10)

        await run_pipeline(llm, until=answered, timeout=90)
        sent = server.connections[0].sent
    at = next(i for i, s in enumerate(sent) if "toolCall" in s.message)
    tool_sent = sent[at].at
    before = [t for t, k in handled if k == "audio" and t < tool_sent][-1]
    after = next(t for t, k in handled if k == "audio" and t > tool_sent)
    stall = (after - before) - (sent[at + 1].at - sent[at - 1].at)
    logged = await logged_at(store, call_id, "tool.call_requested", timeout=0) - tool_sent
    answered_s = await logged_at(store, call_id, "tool.result_sent", timeout=0) - tool_sent
    return stall * 1000, logged * 1000, answered_s * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    logger.remove()
    DurableGeminiLiveLLMService._handle_server_message = _timed
    sizes = [900_000, 5_000_000] if args.quick else [100_000, 900_000, 5_000_000, 15_000_000]
    targets = [("sqlite", None)] if args.quick else [("sqlite", None), ("postgres", PG_URL)]
    print(f"{'db':9} {'size':>8} {'stall ms':>9} {'logged ms':>10} {'answered ms':>12}")
    for name, url in targets:
        schema = None
        if url is None:
            url = f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/bench.db"
        else:
            import asyncpg
            schema = f"bench_{uuid.uuid4().hex[:8]}"
            conn = await asyncpg.connect(url.replace("+asyncpg", ""))
            await conn.execute(f"CREATE SCHEMA {schema}")
            await conn.close()
        await upgrade(url, schema=schema)
        store = await open_store(url, **({"schema": schema} if schema else {}))
        try:
            for size in sizes:
                stall, logged, answered = await one(store, size)
                print(f"{name:9} {size / 1e6:7.1f}M {stall:9.1f} {logged:10.1f} {answered:12.1f}")
        finally:
            await store.close()
            if schema:
                conn = await asyncpg.connect(url.replace("+asyncpg", ""))
                await conn.execute(f"DROP SCHEMA {schema} CASCADE")
                await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
