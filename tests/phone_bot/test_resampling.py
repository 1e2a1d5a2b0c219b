"""examples/phone_bot/resampling.py: the call's audio resampled chunk for chunk, through the
bot's Twilio serializer (pipecat's soxr stream resampler gave the first 120 ms of a turn in
one block, after three chunks that gave nothing)."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import numpy as np
import pytest
from pipecat.frames.frames import InputAudioRawFrame, OutputAudioRawFrame
from pipecat.serializers.twilio import TwilioFrameSerializer

from examples.phone_bot.bot import CallerAwareTwilioSerializer
from examples.phone_bot.resampling import IntegerRatioResampler


def tone(hz: float, rate: int, seconds: float) -> np.ndarray:
    return (8000 * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)).astype("<i2")


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))


async def resampled(resampler, samples: np.ndarray, chunk: int, in_rate: int,
                    out_rate: int) -> np.ndarray:
    out = b"".join([await resampler.resample(samples[i:i + chunk].tobytes(), in_rate, out_rate)
                    for i in range(0, len(samples), chunk)])
    return np.frombuffer(out, dtype="<i2")


async def test_the_first_40_ms_of_bot_audio_go_to_twilio_at_once():
    serializer = CallerAwareTwilioSerializer(
        stream_sid="MZ1", call_sid="CA1",
        params=TwilioFrameSerializer.InputParams(auto_hang_up=False))
    chunk = OutputAudioRawFrame(tone(440, 24000, 0.04).tobytes(), sample_rate=24000,
                                num_channels=1)
    message = json.loads(await serializer.serialize(chunk))
    assert message["event"] == "media"
    assert len(base64.b64decode(message["media"]["payload"])) == 320  # 40 ms at 8 kHz


async def test_the_first_20_ms_of_the_callers_audio_go_to_gemini_at_once():
    serializer = CallerAwareTwilioSerializer(
        stream_sid="MZ1", call_sid="CA1",
        params=TwilioFrameSerializer.InputParams(auto_hang_up=False))
    await serializer.setup(SimpleNamespace(audio_in_sample_rate=16000))
    payload = base64.b64encode(b"\x7f" * 160).decode()  # 20 ms of μ-law
    frame = await serializer.deserialize(json.dumps(
        {"event": "media", "streamSid": "MZ1", "media": {"payload": payload}}))
    assert isinstance(frame, InputAudioRawFrame) and len(frame.audio) == 640  # 20 ms at 16 kHz


@pytest.mark.parametrize("hz, kept", [(300, True), (1000, True), (3000, True),
                                      (4500, False), (6000, False), (11000, False)])
async def test_24_to_8_khz_keeps_the_phone_band_and_stops_what_would_alias(hz, kept):
    samples = tone(hz, 24000, 0.4)
    out = await resampled(IntegerRatioResampler(), samples, 960, 24000, 8000)
    assert len(out) == len(samples) // 3
    gain = rms(out[100:]) / rms(samples)
    assert (0.97 < gain < 1.03) if kept else gain < 0.01


@pytest.mark.parametrize("hz, kept", [(300, True), (3000, True), (5000, False)])
async def test_8_to_16_khz_keeps_the_phone_band(hz, kept):
    samples = tone(hz, 8000, 0.4)
    out = await resampled(IntegerRatioResampler(), samples, 160, 8000, 16000)
    assert len(out) == 2 * len(samples)
    # (a 5 kHz tone cannot be in 8 kHz audio: it comes back as its 3 kHz alias, and that
    # alias's image above 4 kHz is what the filter stops)
    spectrum = np.abs(np.fft.rfft(out[400:].astype(np.float64)))
    image = spectrum[int(len(out[400:]) * 5000 / 16000)] / spectrum.max()
    assert image < 0.01
    if kept:
        assert 0.97 < rms(out[400:]) / rms(samples) < 1.03


async def test_the_output_does_not_depend_on_how_the_audio_is_cut():
    samples = tone(1000, 24000, 0.3)
    whole = await IntegerRatioResampler().resample(samples.tobytes(), 24000, 8000)
    resampler, cut, at = IntegerRatioResampler(), b"", 0
    for size in (7, 100, 961, 5, 2000, 3333, len(samples)):
        cut += await resampler.resample(samples[at:at + size].tobytes(), 24000, 8000)
        at += size
    assert cut == whole


async def test_other_rates_go_to_pipecats_resampler():
    samples = tone(1000, 22050, 0.5)
    out = await resampled(IntegerRatioResampler(), samples, 2205, 22050, 16000)
    assert 0.9 * 8000 < len(out) <= 8000
