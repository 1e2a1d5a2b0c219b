"""Run the local Gemini Live server in a process of its own.

    python -m service.local_live --scenario tool_call --record /tmp/live.json
    python -m service.local_live --scenario speak --profile 3.1
    python -m service.local_live --script bench/turn_scripts.py:overhead_script:20 \
        --record /tmp/live.json --exit-after 1

``--script FILE.py:FUNCTION[:INT...]`` serves the Script that FUNCTION(*INTs) returns (a
benchmark's own call, without importing what the benchmark imports). ``--exit-after N``
stops once N connections have closed: a benchmark then measures against a server that does
not share its event loop (nor its CPU time), as Gemini does not.

Each connection follows the rules of the model generation its setup names (see
``profiles.py``); ``--profile NAME`` forces one generation for every connection.

Prints one JSON line (``base_url``, ``cert_path``, ``port``) once it listens, so a
harness can point clients at it (see ``server.http_options(base_url, cert_path)``).
The record is rewritten at ``--record`` whenever a connection closes and on exit
(SIGTERM or SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import signal
from pathlib import Path

from .profiles import PROFILES
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


def load_script(spec: str) -> Script:
    """``FILE.py:FUNCTION[:INT...]`` → FUNCTION(*INTs), loaded from the file by path."""
    path, function, *args = spec.split(":")
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if module_spec is None or module_spec.loader is None:
        raise SystemExit(f"--script: cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    script = getattr(module, function)(*(int(a) for a in args))
    if not isinstance(script, Script):
        raise SystemExit(f"--script: {function} returned {type(script).__name__}, not a Script")
    return script


async def _serve(port: int, script: Script, record: str | None, exit_after: int | None,
                 profile: str | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with LocalLiveServer(script, port=port, record_path=record, profile=profile) as server:
        ready = {"base_url": server.base_url, "cert_path": str(server.cert_path), "port": server.port}
        print(json.dumps(ready), flush=True)
        if exit_after is None:
            await stop.wait()
            return
        closed = asyncio.ensure_future(server.wait_until(
            lambda: sum(not c.is_open for c in server.connections) >= exit_after,
            timeout=86_400.0))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({closed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for waiter in (closed, stopped):
            waiter.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="idle")
    parser.add_argument("--script", help="FILE.py:FUNCTION[:INT...] returning the Script "
                        "(instead of --scenario)")
    parser.add_argument("--record", help="JSON file to keep the server's record in")
    parser.add_argument("--exit-after", type=int, help="stop once this many connections closed")
    parser.add_argument("--profile", choices=sorted(PROFILES),
                        help="follow this generation's rules whatever model a setup names")
    args = parser.parse_args()
    script = load_script(args.script) if args.script else SCENARIOS[args.scenario]
    asyncio.run(_serve(args.port, script, args.record, args.exit_after, args.profile))


if __name__ == "__main__":
    main()
