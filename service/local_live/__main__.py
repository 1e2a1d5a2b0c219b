"""Run the local Gemini Live server in a process of its own.

    python -m service.local_live --scenario tool_call --record /tmp/live.json

Prints one JSON line (``base_url``, ``cert_path``, ``port``) once it listens, so a
harness can point clients at it (see ``server.http_options(base_url, cert_path)``).
The record is rewritten at ``--record`` whenever a connection closes and on exit
(SIGTERM or SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

from .script import Audio, Call, Script, ToolCall, TurnComplete, WaitToolResponse
from .server import LocalLiveServer

SCENARIOS: dict[str, Script] = {
    # Says nothing; answers tool results with the default short reply.
    "idle": Script(),
    # One spoken turn per connection.
    "speak": Script([Audio(chunks=10, pause_ms=20), TurnComplete()]),
    # Speaks, asks for a tool call mid-turn, waits for its result, finishes the turn.
    "tool_call": Script(
        [
            Audio(chunks=10, pause_ms=20),
            ToolCall([Call("call-1", "lookup_order", {"order_id": 1})]),
            Audio(chunks=10, pause_ms=20),
            WaitToolResponse("call-1", timeout=60),
            Audio(chunks=5, pause_ms=20),
            TurnComplete(),
        ]
    ),
}


async def _serve(port: int, scenario: str, record: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with LocalLiveServer(SCENARIOS[scenario], port=port, record_path=record) as server:
        ready = {"base_url": server.base_url, "cert_path": str(server.cert_path), "port": server.port}
        print(json.dumps(ready), flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="idle")
    parser.add_argument("--record", help="JSON file to keep the server's record in")
    args = parser.parse_args()
    asyncio.run(_serve(args.port, args.scenario, args.record))


if __name__ == "__main__":
    main()
