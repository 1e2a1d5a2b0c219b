"""The caller talking over the bot after the model finished its turn (issue #32, item 6).

Gemini Live's `interrupted` cuts only a generation under way. Gemini generates faster than
real time, so when the model has finished a long turn most of its audio is still to play
(queued in pipecat's transport and in Twilio's buffer), and the server has nothing left to
interrupt. A voice detector on the caller's audio covers that: pipecat's Silero VAD in the
user aggregator, and a user-turn start strategy that starts a turn (with pipecat's
interruption: the transport drops the rest, the serializer sends Twilio `clear`) when the
caller speaks while bot audio is still playing and no model turn is under way. The service
logs the interruption and cuts the bot's logged message to what was heard (the playback
position from the marks, playback.py).

Gemini's own voice detection keeps the caller's turns: these turns emit no
UserStarted/StoppedSpeakingFrame (stock pipecat would also send `activityStart`/`End` or a
`turnComplete` for them), and while the model generates, Gemini alone decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import onnxruntime
from loguru import logger
from pipecat.audio.vad.silero import SileroOnnxModel, SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADAnalyzer, VADParams, VADState
from pipecat.frames.frames import Frame, VADUserStartedSpeakingFrame, VADUserStoppedSpeakingFrame
from pipecat.turns.types import ProcessFrameResult
from pipecat.turns.user_start import VADUserTurnStartStrategy
from pipecat.turns.user_stop import BaseUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies


#: How much caller audio the VAD takes per analysis (it adds up to this much to detection).
VAD_BATCH_MS = 100


class PlayoutBargeInStart(VADUserTurnStartStrategy):
    """A user turn (and pipecat's interruption) when the VAD hears the caller while
    `talked_over()` says bot audio is playing that no model turn is still generating."""

    def __init__(self, talked_over: Callable[[], bool]):
        super().__init__(enable_interruptions=True)
        self._talked_over = talked_over

    async def process_frame(self, frame: Frame) -> ProcessFrameResult:
        if isinstance(frame, VADUserStartedSpeakingFrame):
            talked_over = self._talked_over()
            logger.debug(f"{self}: the caller speaks; over the bot's audio: {talked_over}")
            if talked_over:
                await self.trigger_user_turn_started(enable_user_speaking_frames=False)
                return ProcessFrameResult.STOP
        return ProcessFrameResult.CONTINUE


class PlayoutBargeInStop(BaseUserTurnStopStrategy):
    """Ends that turn when the VAD hears the caller stop, so the next one can start."""

    async def process_frame(self, frame: Frame) -> ProcessFrameResult:
        if isinstance(frame, VADUserStoppedSpeakingFrame):
            await self.trigger_user_turn_stopped(enable_user_speaking_frames=False)
        return ProcessFrameResult.CONTINUE


def barge_in_strategies(talked_over: Callable[[], bool]) -> UserTurnStrategies:
    return UserTurnStrategies(start=[PlayoutBargeInStart(talked_over)],
                              stop=[PlayoutBargeInStop()])


class _CallVadState(SileroOnnxModel):
    """Silero's recurrent state for one call, around the process's one ONNX session (whose
    `run` is safe from several threads: each analyzer runs it from its own)."""

    def __init__(self, session: onnxruntime.InferenceSession):  # noqa: super() loads a model
        self.session = session
        self.sample_rates = [8000, 16000]
        self.reset_states()


class SharedModelSileroVAD(SileroVADAnalyzer):
    """pipecat's Silero VAD analyzer without loading the model: its constructor blocks the
    event loop 30-150 ms (every other call on the worker goes silent that long); this one
    shares a model loaded once, off the loop (`load_vad_model`)."""

    def __init__(self, session: onnxruntime.InferenceSession, *, params: VADParams | None = None,
                 listening: Callable[[], bool] = lambda: True):
        VADAnalyzer.__init__(self, params=params)  # noqa: the rest of super().__init__ below
        self._model = _CallVadState(session)
        self._windows_since_reset = 0
        self._low_confidence_windows = 0
        self._unanalyzed = b""
        self._listening = listening

    async def analyze_audio(self, buffer: bytes) -> VADState:
        """Analyzed VAD_BATCH_MS at a time: each analysis is a hop to the analyzer's thread
        and back, and on a starved CPU (load 27 on 2 cores) one hop per 20 ms Twilio frame
        fell seconds behind the caller; the state holds in between.

        Only while `listening()`: the detector costs ~3 % of a core per call analysing
        everything, and its one use is a barge-in over audio still playing; it starts from
        silence each time (Silero needs ~0.36 s of speech either way)."""
        if not self._listening():
            if self._unanalyzed or self._vad_state != VADState.QUIET:
                self._forget()
            return VADState.QUIET
        self._unanalyzed += buffer
        if len(self._unanalyzed) < VAD_BATCH_MS * self.sample_rate * 2 // 1000:
            return self._vad_state
        audio, self._unanalyzed = self._unanalyzed, b""
        return await super().analyze_audio(audio)

    def _forget(self) -> None:
        """Back to silence, as if the caller's audio so far had not been heard."""
        self._unanalyzed = self._vad_buffer = b""
        self._vad_state = VADState.QUIET
        self._vad_starting_count = self._vad_stopping_count = 0
        self._model.reset_states()


_model: onnxruntime.InferenceSession | None = None


def _load() -> onnxruntime.InferenceSession:
    return SileroVADAnalyzer()._model.session  # pipecat's own packaged model and options


async def load_vad_model() -> onnxruntime.InferenceSession:
    """The process's Silero model, loaded in a thread on first use (the worker loads it at
    startup: a call then starts without waiting for it; two first uses at once both load,
    one is kept)."""
    global _model
    if _model is None:
        session = await asyncio.to_thread(_load)
        _model = _model or session
    return _model
