"""The caller's audio while no Gemini session can take it.

Between sessions (a reconnect's handshake, a fresh session's seed, a takeover's attach and
connect) pipecat drops the caller's audio: what they say then never reaches the model, and
planned reconnects wait for the bot to fall silent, which is when callers speak. The hold
keeps the newest `limit_s` seconds of it and hands it over, in order, before the first
audio the next session takes.

A session replaced because it said a turn the caller cut short (3.1, 3.8 thinking:
session_store/cut_notes.py) goes while the caller is talking over it, and it heard the start
of what they said. If it had not answered them yet, that audio is sent again to the new
session (`replay_since`): from REPLAY_LEAD_S before the interruption, which voice detection
reports some tenths of a second after the caller's first syllable.

The service holds nothing while pipecat pauses the caller's audio or runs its own turn
detection (it then sends audio only inside an activity window opened on the old session).
"""

from __future__ import annotations

import time
from collections import deque

from loguru import logger
from pipecat.frames.frames import InputAudioRawFrame

#: Held audio goes out in chunks of at most this long: a second held is 5 messages, not 50.
RELEASE_CHUNK_S = 0.2
#: How far before the interruption the caller's audio is sent again to a replacing session.
REPLAY_LEAD_S = 1.0


def _seconds(frame: InputAudioRawFrame) -> float:
    return len(frame.audio) / (2 * frame.sample_rate * max(frame.num_channels, 1))


class CallerAudioHold:
    """The caller's audio held for the next session: the newest `limit_s` seconds, the
    older dropped (counted in `dropped_s`, and said in the log)."""

    def __init__(self, limit_s: float, label: str = ""):
        self.limit_s = limit_s
        self._label = label
        self._frames: deque[InputAudioRawFrame] = deque()
        self._held_s = 0.0
        self.dropped_s = 0.0  # over the call
        self.released_s = 0.0  # over the call
        self.replayed_s = 0.0  # over the call
        # What the live session was sent lately (monotonic time, frame), for a replay.
        self._recent: deque[tuple[float, InputAudioRawFrame]] = deque()
        self._recent_s = 0.0
        self._recent_cut_at = float("-inf")  # when the newest frame it let go was sent
        self._interrupted_at: float | None = None  # the caller interrupted, unanswered

    @property
    def held_s(self) -> float:
        return self._held_s

    def hold(self, frame: InputAudioRawFrame) -> None:
        self._frames.append(frame)
        self._held_s += _seconds(frame)
        self._trim()

    def hold_again(self, chunks: list[InputAudioRawFrame]) -> None:
        """Chunks the session went before it took them: first in line again."""
        self._frames.extendleft(reversed(chunks))
        self._held_s += sum(_seconds(c) for c in chunks)
        self._trim()

    def sent(self, frame: InputAudioRawFrame) -> None:
        """`frame` went to the live session (kept, up to `limit_s`, for a replay)."""
        if not self.limit_s:
            return
        self._recent.append((time.monotonic(), frame))
        self._recent_s += _seconds(frame)
        while self._recent_s > self.limit_s + 1e-9 and self._recent:
            self._recent_cut_at, gone = self._recent.popleft()
            self._recent_s -= _seconds(gone)

    def caller_interrupted(self) -> None:
        """The caller talked over the bot (the pipeline's interruption)."""
        self._interrupted_at = time.monotonic()

    def model_responded(self) -> None:
        """The live session answered: what the caller said is in its answer, not to replay."""
        self._interrupted_at = None

    @property
    def interrupted_at(self) -> float | None:
        """When the caller last interrupted (monotonic), if the live session has not
        answered since."""
        return self._interrupted_at

    def replay_since(self, interrupted_at: float | None) -> bool:
        """Once the session that said a cut turn is gone: hold again, ahead of anything held,
        what it was sent from REPLAY_LEAD_S before the caller interrupted at `interrupted_at`
        (None: nothing to replay, it had answered them). True if all of that goes again, so
        the new session transcribes it; False if nothing, or not all of it, does."""
        self._interrupted_at = None
        if interrupted_at is None or not self.limit_s:
            return False
        start = interrupted_at - REPLAY_LEAD_S
        again = [frame for at, frame in self._recent if at >= start]
        whole = self._recent_cut_at < start
        self._recent.clear()
        self._recent_s = 0.0
        if not again:
            return False
        seconds = sum(_seconds(f) for f in again)
        self._frames.extendleft(reversed(again))
        self._held_s += seconds
        self.replayed_s += seconds
        trimmed = self._trim()
        logger.info(f"{self._label}: {seconds - trimmed:.2f} s of the caller's audio from "
                    f"before the cut goes again to the session that replaces the one that said "
                    f"the turn")
        return whole and not trimmed

    def _trim(self) -> float:
        """Drop the oldest held audio beyond `limit_s`; how much was dropped."""
        dropped = 0.0
        while self._held_s > self.limit_s + 1e-9 and self._frames:
            seconds = _seconds(self._frames.popleft())
            self._held_s -= seconds
            dropped += seconds
        if dropped:
            if not self.dropped_s:
                logger.warning(f"{self._label}: no Gemini session has taken the caller's "
                               f"audio for over {self.limit_s:g} s; its oldest is dropped")
            self.dropped_s += dropped
        return dropped

    def release(self) -> list[InputAudioRawFrame]:
        """The held audio, oldest first, joined into chunks of up to RELEASE_CHUNK_S (of one
        format each); the hold is empty after."""
        chunks: list[InputAudioRawFrame] = []
        pending: list[InputAudioRawFrame] = []
        pending_s = 0.0

        def flush() -> None:
            if pending:
                first = pending[0]
                chunks.append(InputAudioRawFrame(audio=b"".join(f.audio for f in pending),
                                                 sample_rate=first.sample_rate,
                                                 num_channels=first.num_channels))
                pending.clear()

        for frame in self._frames:
            seconds = _seconds(frame)
            if pending and ((frame.sample_rate, frame.num_channels)
                            != (pending[0].sample_rate, pending[0].num_channels)
                            or pending_s + seconds > RELEASE_CHUNK_S + 1e-9):
                flush()
                pending_s = 0.0
            pending.append(frame)
            pending_s += seconds
        flush()
        if self._frames:
            logger.debug(f"{self._label}: {self._held_s:.2f} s of the caller's audio held "
                         f"between sessions goes to the new one")
        self.released_s += self._held_s
        self._frames.clear()
        self._held_s = 0.0
        return chunks

    def discard(self) -> None:
        """The call goes on nowhere (it ended, was given up or taken over): nothing to keep."""
        self._frames.clear()
        self._held_s = 0.0
        self._recent.clear()
        self._recent_s = 0.0
