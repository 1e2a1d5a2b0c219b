"""examples/phone_bot/barge_in.py's Silero analyzer around the process's one model: built
like pipecat's own (this fails if pipecat's SileroVADAnalyzer changes what it holds), it
scores audio as pipecat's does, and costs a call next to nothing."""

from __future__ import annotations

import time

import numpy as np
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADState

from examples.phone_bot.barge_in import SharedModelSileroVAD, load_vad_model
from examples.phone_bot.hearing import ulaw_to_pcm
from examples.phone_bot.telephony import _tone, _voice


def _pcm16(frames) -> bytes:
    """μ-law at 8 kHz -> 16-bit PCM at 16 kHz (linear interpolation: enough for a detector)."""
    pcm8 = ulaw_to_pcm(b"".join(frames)).astype(np.float64)
    t16 = np.arange(2 * len(pcm8)) / 2
    return np.interp(t16, np.arange(len(pcm8)), pcm8).astype("<i2").tobytes()


def _confidences(analyzer, pcm: bytes) -> list[float]:
    analyzer.set_sample_rate(16000)
    step = analyzer.num_frames_required() * 2
    return [float(np.ravel(analyzer.voice_confidence(pcm[i:i + step]))[0])
            for i in range(0, len(pcm) - step, step)]


async def test_the_shared_model_analyzer_is_pipecats_analyzer_without_the_load():
    model = await load_vad_model()
    assert await load_vad_model() is model  # loaded once per process
    stock = SileroVADAnalyzer()
    shared = SharedModelSileroVAD(model)
    assert set(vars(stock)) <= set(vars(shared))
    assert set(vars(shared._model)) == set(vars(stock._model))
    voice = _pcm16(_voice(1.0))
    assert _confidences(shared, voice) == _confidences(SileroVADAnalyzer(), voice)
    assert max(_confidences(SharedModelSileroVAD(model), voice)) > 0.95
    assert max(_confidences(SharedModelSileroVAD(model), _pcm16(_tone(1.0)))) < 0.5
    started = time.perf_counter()
    for _ in range(20):
        SharedModelSileroVAD(model)
    assert (time.perf_counter() - started) / 20 < 0.002  # vs 30-150 ms loading the model


async def test_it_hears_the_caller_only_while_listening_and_starts_from_silence():
    """Analysing only while bot audio plays after the model's turn: the caller's voice at
    other times is not analysed (QUIET), and what it heard before does not carry over."""
    listening = False
    analyzer = SharedModelSileroVAD(await load_vad_model(), listening=lambda: listening)
    analyzer.set_sample_rate(16000)
    voice = _pcm16(_voice(2.0))
    frame = 16000 * 2 * 20 // 1000  # 20 ms, a Twilio frame's worth at 16 kHz

    async def feed(pcm: bytes):
        return [await analyzer.analyze_audio(pcm[i:i + frame]) for i in range(0, len(pcm), frame)]

    calls = 0
    confidence = analyzer.voice_confidence

    def counted(buffer):
        nonlocal calls
        calls += 1
        return confidence(buffer)

    analyzer.voice_confidence = counted
    assert set(await feed(voice[:len(voice) // 2])) == {VADState.QUIET}
    assert calls == 0  # nothing analysed while not listening
    listening = True
    states = await feed(voice)
    assert calls > 0 and states[-1] == VADState.SPEAKING
    # A whole second of voice heard only after listening began: it starts from silence.
    assert VADState.SPEAKING not in states[:len(states) // 8], states[:10]
    listening = False
    assert await analyzer.analyze_audio(voice[:frame]) == VADState.QUIET
    assert analyzer._vad_state == VADState.QUIET and analyzer._unanalyzed == b""
