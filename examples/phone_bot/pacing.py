"""The bot's audio written to Twilio a little ahead of the caller's playback, catching up
after a late write.

pipecat's websocket transport paces its writes to real time, one chunk ahead, and a write
that comes late restarts its clock: the time the loop lost is never made up. Twilio plays
what it is sent in order and buffers what comes early, so every late write (a busy loop,
a process short of CPU) is heard, and in a turn they add up until the caller's buffer runs
dry. Here the clock is the caller's: when the audio sent so far will have played out.
Writes go as soon as less than `LEAD_S` of it is left, so a block of the loop shorter
than that is not heard, and after one the writes catch up at once. The clock restarts
only when the caller's audio has run out (a new turn, or a block longer than the lead),
and on an interruption (pipecat sends Twilio a `clear`, which drops what is buffered).
"""

from __future__ import annotations

import asyncio
import time

from pipecat.frames.frames import Frame, InterruptionFrame
from pipecat.processors.frame_processor import FrameDirection
from pipecat.transports.websocket.fastapi import (FastAPIWebsocketOutputTransport,
                                                  FastAPIWebsocketTransport)

LEAD_S = 0.2  # audio kept buffered at Twilio ahead of what the caller is hearing


class PlayoutClock:
    """When the audio written so far will have played out at the caller, given that each
    write plays after the one before it, or at once if the caller's audio had run out."""

    def __init__(self, lead_s: float = LEAD_S):
        if lead_s < 0:
            raise ValueError(f"lead_s must be >= 0, not {lead_s}")
        self.lead_s = lead_s
        self.played_out_at = 0.0

    def wrote(self, seconds: float, now: float) -> float:
        """`seconds` of audio written at `now`: how long to wait before the next write."""
        self.played_out_at = max(self.played_out_at, now) + seconds
        return max(0.0, self.played_out_at - self.lead_s - now)

    def reset(self) -> None:
        self.played_out_at = 0.0


class LeadPacedOutputTransport(FastAPIWebsocketOutputTransport):
    """pipecat's websocket output with its audio paced by a PlayoutClock."""

    def __init__(self, *args, lead_s: float = LEAD_S, **kwargs):
        super().__init__(*args, **kwargs)
        self.clock = PlayoutClock(lead_s)

    async def _write_audio_sleep(self):
        await asyncio.sleep(self.clock.wrote(self._send_interval, time.monotonic()))

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame):
            self.clock.reset()


class LeadPacedWebsocketTransport(FastAPIWebsocketTransport):
    """FastAPIWebsocketTransport whose output is a LeadPacedOutputTransport."""

    def __init__(self, *args, lead_s: float = LEAD_S, **kwargs):
        super().__init__(*args, **kwargs)
        self._output = LeadPacedOutputTransport(self, self._client, self._params,
                                                name=self._output_name, lead_s=lead_s)
