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
from dataclasses import dataclass, field

from pipecat.frames.frames import (Frame, InterruptionFrame, OutputAudioRawFrame,
                                   OutputTransportMessageFrame, TTSStoppedFrame)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

MARK_EVERY_MS = 100
MARK_PREFIX = "bot-audio"


@dataclass
class _TurnPlayback:
    """One bot turn's audio: how much went to the transport, and how much the echoes say
    the caller heard."""

    number: int
    sent_ms: float = 0.0
    marked_ms: float = 0.0
    played_ms: float = 0.0  # the newest echoed mark
    played_at: float = 0.0  # when that echo came (monotonic)
    pending: list[float] = field(default_factory=list)  # positions of marks not echoed yet

    def echoed(self, at_ms: float) -> None:
        if at_ms > self.played_ms:
            self.played_ms, self.played_at = at_ms, time.monotonic()
            self.pending = [p for p in self.pending if p > at_ms + 0.5]

    def heard_fraction(self) -> float | None:
        if self.sent_ms <= 0:
            return None
        played = self.played_ms
        if self.played_at:  # it went on playing past the echo, up to the next mark at most
            since_ms = 1000 * (time.monotonic() - self.played_at)
            played = min(played + since_ms, self.pending[0] if self.pending else played)
        return min(1.0, played / self.sent_ms)


class PlaybackMarks(FrameProcessor):
    """Marks the bot's audio as it goes out, and learns from their echoes what played."""

    def __init__(self, stream_sid: str, **kwargs):
        super().__init__(**kwargs)
        self._stream_sid = stream_sid
        self._current = _TurnPlayback(0)
        # The model's last finished turn (TTSStoppedFrame passed: its audio is all queued),
        # while the caller may still be hearing it.
        self._finished: _TurnPlayback | None = None
        self.marks_sent = 0
        self.marks_played = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if direction != FrameDirection.DOWNSTREAM:
            return
        turn = self._current
        if isinstance(frame, OutputAudioRawFrame) and frame.sample_rate:
            turn.sent_ms += 1000 * len(frame.audio) / (2 * frame.sample_rate
                                                      * max(1, frame.num_channels))
            if turn.sent_ms - turn.marked_ms >= MARK_EVERY_MS:
                await self._mark()
        elif isinstance(frame, TTSStoppedFrame):
            if turn.sent_ms > turn.marked_ms:
                await self._mark()  # the end of the turn: it played in full once echoed
            if turn.sent_ms > 0:
                self._finished = turn
            self._current = _TurnPlayback(turn.number + 1)
        elif isinstance(frame, InterruptionFrame):
            # The transport clears: what was queued never plays, what follows is a new turn.
            self._finished = None
            self._current = _TurnPlayback(turn.number + 1)

    async def _mark(self) -> None:
        turn = self._current
        turn.marked_ms = turn.sent_ms
        turn.pending.append(turn.sent_ms)
        self.marks_sent += 1
        await self.push_frame(OutputTransportMessageFrame(message={
            "event": "mark", "streamSid": self._stream_sid,
            "mark": {"name": f"{MARK_PREFIX}:{turn.number}:{round(turn.sent_ms)}"}}))

    def played(self, name: str) -> None:
        """Twilio echoed the mark `name`: the audio before it has played."""
        prefix, _, rest = name.partition(":")
        number, _, at_ms = rest.partition(":")
        if prefix != MARK_PREFIX or not number.isdigit() or not at_ms.isdigit():
            return  # not ours
        self.marks_played += 1
        for turn in (self._current, self._finished):
            if turn is not None and turn.number == int(number):
                turn.echoed(float(at_ms))

    def heard_fraction(self) -> float | None:
        """The part of the current turn's audio the caller has heard; None before any. Past
        the newest echo the audio went on playing, up to the next mark at most (its echo
        has not come: the caller may not have heard further)."""
        return self._current.heard_fraction()

    def finished_turn_heard(self) -> float | None:
        """The part of the model's last finished turn the caller has heard, while they are
        still hearing it (its last mark not echoed); None once it played in full, or if no
        turn finished since the last interruption."""
        turn = self._finished
        if turn is None or not turn.pending:
            return None
        return turn.heard_fraction()

    def playing(self) -> bool:
        """The caller may still be hearing bot audio: a mark sent is not echoed yet."""
        return bool(self._current.pending or (self._finished and self._finished.pending))
