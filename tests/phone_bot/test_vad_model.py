"""examples/phone_bot/barge_in.py's Silero analyzer around the process's one model: built
like pipecat's own (this fails if pipecat's SileroVADAnalyzer changes what it holds), it
scores audio as pipecat's does, and costs a call next to nothing."""

from __future__ import annotations

import audioop
import time

import numpy as np
from pipecat.audio.vad.silero import SileroVADAnalyzer

from examples.phone_bot.barge_in import SharedModelSileroVAD, load_vad_model
from examples.phone_bot.telephony import _tone, _voice


def _pcm16(frames) -> bytes:
    pcm16, _ = audioop.ratecv(audioop.ulaw2lin(b"".join(frames), 2), 2, 1, 8000, 16000, None)
    return pcm16


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
