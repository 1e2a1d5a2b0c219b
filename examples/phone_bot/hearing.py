"""What a caller heard, from the audio their phone received (the fleet's ear).

Every utterance of the scripted bot is a tone of its own (gemini_script.TONES). The caller's
side decodes the μ-law frames Twilio's stand-in received, plays them on a phone's clock (a
frame plays when the one before it ends, or `JITTER_S` after it arrives if the phone ran
dry), finds the
tone of every 20 ms and so tells, per call and across its streams:

- a **repeat**: an utterance heard whole, then heard again (the conversation went backwards);
  the rest of an utterance heard on the next stream is not one, unless the parts add up to
  more than it lasts;
- a **restart**: an utterance cut off (the caller heard part of it), said again from the top
  by the next worker, so its audio heard adds up to more than its length;
- an **unfinished** utterance: cut off and never heard whole afterwards (after a takeover:
  the caller never heard the rest of what the bot was saying);
- a **stall**: a silence of more than `STALL_S` inside an utterance, on one stream (the
  gap a takeover leaves between two streams is measured on its own: kill -> first audio).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

RATE = 8000  # Twilio Media Streams: 8 kHz μ-law
FRAME = 160  # 20 ms
STALL_S = 0.1
#: Audio is played this long after the first frame of a stretch arrives, as from a phone's
#: jitter buffer: frames arriving up to that late play without a break. (The worker sends
#: 137.5 ms payloads every 120-160 ms: played on arrival, every one left a gap.)
JITTER_S = 0.1
SILENT_RMS = 300.0  # of a 16-bit full scale; the tones are sent at 8000 peak
TOLERANCE_HZ = 60.0
WHOLE = 0.75  # heard this share of an utterance: it was heard (a 0.8 s one plays as ~0.7 s)
OVERHEARD_S = 0.15  # heard this much more than an utterance lasts: some of it twice


def _ulaw_table() -> np.ndarray:
    """G.711 μ-law byte -> 16-bit sample (audioop, which pipecat's serializer uses, is
    deprecated: the decode is a table of 256)."""
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    magnitude = (((code & 0x0F) << 3) + 0x84) << ((code >> 4) & 0x07)
    return np.where(code & 0x80, 0x84 - magnitude, magnitude - 0x84).astype(np.int16)


ULAW = _ulaw_table()


def ulaw_to_pcm(payload: bytes) -> np.ndarray:
    return ULAW[np.frombuffer(payload, dtype=np.uint8)]


def pcm_to_ulaw(pcm: bytes) -> bytes:
    """16-bit little-endian samples -> G.711 μ-law, byte for byte as audioop.lin2ulaw
    (14-bit magnitude, bias 0x21, clipped at 8159; the top segment saturates)."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.int32) >> 2
    mask = np.where(x < 0, 0x7F, 0xFF)
    biased = np.minimum(np.abs(x), 8159) + 0x21
    segment = np.floor(np.log2(biased)).astype(np.int32) - 5
    code = np.where(segment >= 8, 0x7F, (segment << 4) | ((biased >> (segment + 1)) & 0x0F))
    return (code ^ mask).astype(np.uint8).tobytes()


@dataclass
class Run:
    """A stretch of one utterance's tone, heard without a break."""

    utterance: str
    stream: int
    start: float  # on the phone's playback clock (time.time() seconds)
    end: float
    arrived: float = 0.0  # when the payload holding its first frame was received
    after_dry: bool = False  # it starts a new stretch: the phone had run dry before it

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Stall(NamedTuple):
    """A silence inside an utterance on one stream. `dry` is a phone that ran out of audio:
    the frame that ended it was received `arrived_at`, `late_s` after the audio before it
    had played out (`silent_from`); otherwise frames came in time but held no tone."""

    utterance: str
    seconds: float
    stream: int
    silent_from: float
    arrived_at: float
    dry: bool

    @property
    def late_s(self) -> float:
        return self.arrived_at - self.silent_from


@dataclass
class Hearing:
    runs: list[Run] = field(default_factory=list)
    repeats: list[str] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    heard_s: dict[str, float] = field(default_factory=dict)


def tone_of(pcm: np.ndarray, tones: dict[str, float]) -> str | None:
    """The utterance whose tone one frame carries, or None (silence, or no known tone)."""
    if float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) < SILENT_RMS:
        return None
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    peak = int(np.argmax(spectrum[1:])) + 1
    hz = peak * RATE / len(pcm)
    name, tone = min(tones.items(), key=lambda item: abs(item[1] - hz))
    return name if abs(tone - hz) <= TOLERANCE_HZ else None


def runs_of(streams: Sequence[Sequence[tuple[float, bytes]]], tones: dict[str, float]
            ) -> list[Run]:
    """Each stream's audio as played, cut into runs of one tone (a silence or a gap in the
    audio ends a run)."""
    runs: list[Run] = []
    for index, audio in enumerate(streams):
        clock, pending = None, np.zeros(0, dtype=np.int16)
        current: Run | None = None
        dried = False  # since the last run: the phone ran out of audio
        for at, payload in audio:
            if clock is None or at > clock:  # the phone ran dry: a gap
                current, dried = None, clock is not None
                clock, pending = at + JITTER_S, pending[:0]
            pending = np.concatenate([pending, ulaw_to_pcm(payload)])
            while len(pending) >= FRAME:
                pcm, pending = pending[:FRAME], pending[FRAME:]
                name = tone_of(pcm, tones)
                start, clock = clock, clock + FRAME / RATE
                if name is None:
                    current = None
                elif current is not None and current.utterance == name:
                    current.end = clock
                else:
                    current = Run(name, index, start, clock, at, dried)
                    runs.append(current)
                    dried = False
    return runs


def judge(runs: list[Run], lengths: dict[str, float]) -> Hearing:
    """Repeats, restarts and stalls, from the runs of one call in the order heard."""
    out = Hearing(runs=runs)
    last: dict[str, Run] = {}
    since_whole: dict[str, float] = {}  # heard of the utterance since it was last whole
    for i, run in enumerate(runs):
        name, length = run.utterance, lengths.get(run.utterance, 0.0)
        out.heard_s[name] = out.heard_s.get(name, 0.0) + run.seconds
        before = last.get(name)
        heard = since_whole.get(name, 0.0)
        if before is not None:
            between = [r for r in runs[:i] if r.start >= before.end]
            # More of it (on one stream with nothing said between, or the rest of it on the
            # next stream) is the same utterance going on, unless it adds up to more than
            # it lasts: then some of it was heard twice.
            over = heard + run.seconds > length + OVERHEARD_S
            goes_on = not over and (run.stream != before.stream or not between)
            if heard >= WHOLE * length and not goes_on:
                out.repeats.append(f"{name}: heard whole, then again at "
                                   f"{run.start - runs[0].start:.2f} s")
                heard = 0.0
            elif run.stream != before.stream:
                if over:
                    out.restarts.append(f"{name}: {heard:.2f} s heard before the takeover, "
                                        f"said again from the top after it")
                    heard = 0.0
            elif not between and run.start - before.end > STALL_S:
                out.stalls.append(Stall(name, round(run.start - before.end, 3), run.stream,
                                        before.end, run.arrived, run.after_dry))
        since_whole[name] = heard + run.seconds
        last[name] = run
    out.unfinished = [f"{name}: {heard:.2f} s of {lengths[name]:.2f} s heard"
                      for name, heard in since_whole.items()
                      if name in lengths and heard < WHOLE * lengths[name]]
    return out


def hear(streams: Sequence[Sequence[tuple[float, bytes]]], tones: dict[str, float],
         lengths: dict[str, float]) -> Hearing:
    """What one caller heard over the call's streams, in order."""
    return judge(runs_of(streams, tones), lengths)
