"""What taking in one server frame costs the worker: google-genai's own receive against the
service's guarded one (service/wire.py), in the same run.

Most frames of a call are one chunk of the model's audio. The SDK parses every frame through
its generic path (a converter, a walk for unknown fields, pydantic validation); the guarded
receive builds an audio chunk's message directly (`wire.audio_chunk`) and hands every other
frame to the SDK, after looking once for fields the SDK would drop. Frames come from an
in-memory socket, so only the parse is timed, in CPU time (what a worker pays whatever else
the machine runs):

- audio: 40 ms of 24 kHz audio per frame, as Gemini streams the bot's speech;
- other: an output transcription (the SDK's path in both; ours adds the unknown-field check
  the service always made).

    python bench/receive_parse.py            # 5 rounds of 5,000 frames per variant
    python bench/receive_parse.py --quick    # 2 rounds of 2,000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from google import genai  # noqa: E402
from google.genai.live import AsyncSession  # noqa: E402

from service.wire import guard_session  # noqa: E402

FRAMES = {
    "audio": json.dumps({"serverContent": {"modelTurn": {"parts": [{"inlineData": {
        "mimeType": "audio/pcm;rate=24000",
        "data": base64.b64encode(bytes(range(256)) * 7 + b"\0" * 128).decode()}}]}}}).encode(),
    "other": json.dumps({"serverContent": {"outputTranscription": {
        "text": " let me look that order up for you"}}}).encode(),
}


class Socket:
    """The same frame, as often as asked."""

    def __init__(self, frame: bytes):
        self._frame = frame

    async def recv(self, decode=None):
        return self._frame


async def cpu_per_frame_us(guarded: bool, frame: bytes, frames: int) -> float:
    client = genai.Client(api_key="bench")
    session = AsyncSession(api_client=client._api_client, websocket=Socket(frame))
    if guarded:
        async def report(rejection):
            raise AssertionError(f"the bench's frame was rejected: {rejection}")
        guard_session(session, report)
    t0 = time.process_time()
    for _ in range(frames):
        await session._receive()
    return (time.process_time() - t0) / frames * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2,000 frames (CI)")
    args = parser.parse_args()
    rounds, frames = (2, 2000) if args.quick else (5, 5000)
    result: dict = {"bench": "receive_parse", "quick": args.quick}
    print(f"CPU per server frame taken in, median of {rounds} rounds of {frames} frames (us):")
    for kind, frame in FRAMES.items():
        figures: dict[str, list[float]] = {"stock": [], "ours": []}
        for r in range(rounds):
            # Alternate which goes first: drift over the run hits both alike.
            for name in (("stock", "ours") if r % 2 == 0 else ("ours", "stock")):
                figures[name].append(await cpu_per_frame_us(name == "ours", frame, frames))
        stock, ours = (statistics.median(figures[n]) for n in ("stock", "ours"))
        print(f"  {kind:6} stock (google-genai) {stock:7.1f}   ours (guarded) {ours:7.1f}   "
              f"ratio {ours / stock:.2f}")
        result[kind] = {"stock_us": round(stock, 1), "ours_us": round(ours, 1),
                        "ratio": round(ours / stock, 3)}
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
