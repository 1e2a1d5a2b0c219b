"""The call's audio between Gemini's rates and the phone's 8 kHz, without a block delay.

pipecat's Twilio serializer resamples with a streaming soxr resampler at very high quality,
which returns audio in blocks: 24 kHz -> 8 kHz gives nothing for the first three 40 ms
chunks of a turn and then 137 ms at once, and 8 kHz -> 16 kHz nothing for the first five
20 ms frames of the caller. The transport paces its writes (one chunk per 40 ms), so every
bot turn reached the caller 80-120 ms late, the first audio after a takeover included.

Gemini's rates are whole multiples of the phone's (24 kHz out, 16 kHz in), so a windowed-sinc
FIR filter does it sample for sample: every chunk comes out at once, delayed by half the
filter (2.6 ms at 24 kHz), with the telephone band (300-3400 Hz) passed and what would alias
into it stopped. Other rate pairs go to pipecat's resampler.
"""

from __future__ import annotations

import functools
import time

import numpy as np
from pipecat.audio.resamplers.base_audio_resampler import BaseAudioResampler
from pipecat.audio.utils import create_stream_resampler

TAPS = 127  # at the higher rate; odd: a whole-sample delay of (TAPS - 1) / 2
PASS_HZ = 3500.0  # the filter's cutoff (-6 dB); the phone's band ends at 3400 Hz
CLEAR_AFTER_S = 0.2  # as pipecat's: a pause this long starts the next audio clean


def lowpass(taps: int, cutoff_hz: float, rate: int) -> np.ndarray:
    """A Kaiser-windowed sinc low-pass (about 80 dB down past the transition), gain 1."""
    n = np.arange(taps) - (taps - 1) / 2
    h = np.sinc(2 * cutoff_hz / rate * n) * np.kaiser(taps, 8.0)
    return h / h.sum()


class IntegerRatioResampler(BaseAudioResampler):
    """16-bit mono PCM from one rate to a whole multiple or fraction of it, one chunk in,
    its resampled chunk out (no block to fill first)."""

    def __init__(self, taps: int = TAPS, cutoff_hz: float = PASS_HZ,
                 clear_after_s: float = CLEAR_AFTER_S):
        self._taps, self._cutoff_hz, self._clear_after_s = taps, cutoff_hz, clear_after_s
        self._rates: tuple[int, int] | None = None
        self._phases: list[np.ndarray] = []  # the filter's taps, one set per output phase
        self._history = np.zeros(0)  # the input's last samples, for the next chunk
        self._phase = 0  # decimating: where in the next chunk the next kept sample is
        self._last = 0.0
        self._other: BaseAudioResampler | None = None

    async def resample(self, audio: bytes, in_rate: int, out_rate: int) -> bytes:
        if in_rate == out_rate:
            return audio
        if in_rate % out_rate and out_rate % in_rate:
            if self._other is None:
                self._other = create_stream_resampler()
            return await self._other.resample(audio, in_rate, out_rate)
        now = time.monotonic()
        if self._rates != (in_rate, out_rate) or now - self._last > self._clear_after_s:
            self._start(in_rate, out_rate)
        self._last = now
        return _to_pcm16(self._run(np.frombuffer(audio, dtype="<i2").astype(np.float64)))

    def _start(self, in_rate: int, out_rate: int) -> None:
        self._rates = (in_rate, out_rate)
        self._phases = list(_phases(self._taps, self._cutoff_hz, in_rate, out_rate))
        self._history = np.zeros(len(self._phases[0]) - 1 if out_rate > in_rate
                                 else self._taps - 1)  # at the input rate
        self._phase = 0

    def _run(self, samples: np.ndarray) -> np.ndarray:
        assert self._rates is not None
        in_rate, out_rate = self._rates
        if not len(samples):
            return samples
        joined = np.concatenate([self._history, samples])
        self._history = joined[len(joined) - len(self._history):]
        if out_rate > in_rate:  # output p of each input sample comes from phase p
            factor = out_rate // in_rate
            out = np.empty(len(samples) * factor)
            for p, taps in enumerate(self._phases):
                out[p::factor] = np.convolve(joined, taps, mode="valid")[
                    len(self._phases[0]) - len(taps):]
            return out
        # Decimating: kept output m is joined[phase + m * factor:][:taps] . the reversed
        # filter; cut into rows of `factor` samples that is one correlation per column.
        factor = in_rate // out_rate
        count = len(range(self._phase, len(samples), factor))
        if not count:
            self._phase -= len(samples)
            return np.zeros(0)
        rows = count + len(self._phases[0]) - 1
        span = joined[self._phase:self._phase + rows * factor]
        if len(span) < rows * factor:  # (the zero-padded taps reach past the chunk)
            span = np.concatenate([span, np.zeros(rows * factor - len(span))])
        table = span.reshape(rows, factor)
        self._phase = (self._phase - len(samples)) % factor
        return sum((np.correlate(table[:, r], taps, mode="valid")
                    for r, taps in enumerate(self._phases)), np.zeros(count))

    async def flush(self) -> bytes:
        if self._rates is None:
            return b""
        in_rate, out_rate = self._rates
        # What the filter still holds: its delay's worth of input, pushed out by silence.
        tail = self._run(np.zeros(-(-(self._taps - 1) * in_rate // max(in_rate, out_rate))))
        await self.reset()
        return _to_pcm16(tail)

    async def reset(self):
        self._rates = None
        if self._other is not None:
            await self._other.reset()


@functools.lru_cache(maxsize=16)
def _phases(taps: int, cutoff_hz: float, in_rate: int, out_rate: int) -> tuple[np.ndarray, ...]:
    """The filter's taps, one set per output phase; the same for every call and every turn
    (a resampler starts anew after each pause: designed once, not at every start)."""
    fir = lowpass(taps, cutoff_hz, max(in_rate, out_rate))
    factor = max(in_rate, out_rate) // min(in_rate, out_rate)
    # Polyphase: an output sample needs only every factor-th tap (interpolating: the
    # others meet stuffed zeros; decimating: their outputs are dropped), so each phase
    # is a convolution at the lower rate, 1/factor of one at the higher.
    if out_rate > in_rate:
        phases = [fir[p::factor] * factor for p in range(factor)]
    else:
        padded = np.zeros(-(-taps // factor) * factor)
        padded[:taps] = fir[::-1]
        phases = [padded[r::factor] for r in range(factor)]
    for taps_of_phase in phases:
        taps_of_phase.setflags(write=False)  # shared by every resampler
    return tuple(phases)


def _to_pcm16(samples: np.ndarray) -> bytes:
    return np.clip(np.rint(samples), -32768, 32767).astype("<i2").tobytes()
