"""Where the caller's playback is, from Twilio Media Streams `mark`s.

Twilio plays the `media` it is sent in order and, for a `mark` message, sends the same mark
back once all the audio before it has played; after a `clear` (pipecat's serializer sends
one on an interruption) it drops the buffered audio and returns the marks still pending at
once. So a mark every MARK_EVERY_MS of bot audio tells, within that step, how much of the
bot's current turn the caller has heard: the last mark echoed before the interruption. The
marks of a cleared turn that come back after it are not counted.

`PlaybackMarks` sits just before the output transport (its marks then travel in order with
the audio, through the transport's queue) and is the service's `playback`
(service/playback.py): a bot turn the caller interrupted is logged as far as it was heard.
"""

from __future__ import annotations

import time

from pipecat.frames.frames import (Frame, InterruptionFrame, OutputAudioRawFrame,
                                   OutputTransportMessageFrame, TTSStoppedFrame)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

MARK_EVERY_MS = 100
MARK_PREFIX = "bot-audio"


class PlaybackMarks(FrameProcessor):
    """Marks the bot's audio as it goes out, and learns from their echoes what played."""

    def __init__(self, stream_sid: str, **kwargs):
        super().__init__(**kwargs)
        self._stream_sid = stream_sid
        self._turn = 0
        self._sent_ms = 0.0  # of the current turn's audio, passed to the transport
        self._marked_ms = 0.0
        self._played_ms = 0.0  # of it, heard (the newest echoed mark)
        self._played_at = 0.0  # when that echo came (monotonic)
        self._pending: list[float] = []  # positions of the marks not echoed yet
        self.marks_sent = 0
        self.marks_played = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if direction != FrameDirection.DOWNSTREAM:
            return
        if isinstance(frame, OutputAudioRawFrame) and frame.sample_rate:
            self._sent_ms += 1000 * len(frame.audio) / (2 * frame.sample_rate
                                                       * max(1, frame.num_channels))
            if self._sent_ms - self._marked_ms >= MARK_EVERY_MS:
                await self._mark()
        elif isinstance(frame, TTSStoppedFrame):
            if self._sent_ms > self._marked_ms:
                await self._mark()  # the end of the turn: it played in full once echoed
            self._next_turn()
        elif isinstance(frame, InterruptionFrame):
            self._next_turn()  # the transport clears: what follows is a new turn

    async def _mark(self) -> None:
        self._marked_ms = self._sent_ms
        self._pending.append(self._sent_ms)
        self.marks_sent += 1
        await self.push_frame(OutputTransportMessageFrame(message={
            "event": "mark", "streamSid": self._stream_sid,
            "mark": {"name": f"{MARK_PREFIX}:{self._turn}:{round(self._sent_ms)}"}}))

    def _next_turn(self) -> None:
        self._turn += 1
        self._sent_ms = self._marked_ms = self._played_ms = self._played_at = 0.0
        self._pending = []

    def played(self, name: str) -> None:
        """Twilio echoed the mark `name`: the audio before it has played."""
        prefix, _, rest = name.partition(":")
        turn, _, at_ms = rest.partition(":")
        if prefix != MARK_PREFIX or not turn.isdigit() or not at_ms.isdigit():
            return  # not ours
        self.marks_played += 1
        if int(turn) == self._turn and float(at_ms) > self._played_ms:
            self._played_ms, self._played_at = float(at_ms), time.monotonic()
            self._pending = [p for p in self._pending if p > self._played_ms + 0.5]

    def heard_fraction(self) -> float | None:
        """The part of the current turn's audio the caller has heard; None before any. Past
        the newest echo the audio went on playing, up to the next mark at most (its echo
        has not come: the caller may not have heard further)."""
        if self._sent_ms <= 0:
            return None
        played = self._played_ms
        if self._played_at:
            since_ms = 1000 * (time.monotonic() - self._played_at)
            played = min(played + since_ms, self._pending[0] if self._pending else played)
        return min(1.0, played / self._sent_ms)
