"""The service's safety nets for silence nobody reported, run as one task per call."""

from __future__ import annotations

import asyncio
import time
from loguru import logger

from session_store.decide import InteractionStatusObserved, SpeechStopped

from .driver import CallDriver
from .log_writer import LogWriter, When
from .receiver import Receiver
from .speech import SpeechTracker

#: On a model that reports interaction_status: how long the server may stay silent while it
#: says IN_PROGRESS before the service counts it as idle (pipecat's own held-turn timeout).
IDLE_TIMEOUT_S = 30.0


async def watch_silence(driver: CallDriver, log: LogWriter, speech: SpeechTracker,
                        receiver: Receiver) -> None:
    """Speech the transport never reported ended (no output transport, text-only turns), and
    a model that said IN_PROGRESS and then nothing is idle (pipecat ends its held turn the
    same way), so nothing waits for ever. While the transport is playing it is not silence:
    Gemini sends audio faster than real time, so the last chunk can arrive seconds before
    playback ends (seen on the wire: a deferred call started 1.4 s before the audio
    finished); the transport always ends its stretch (TTSStoppedFrame, or its own 3 s
    fallback). Not while facts wait to be logged: they go first (the transport's own stop
    may be among them), and while the log is down the log writer's task retries them."""
    pause = 0.25
    while True:
        await asyncio.sleep(pause)
        pause = 0.25
        state = driver.state
        if (state.bot_speaking and not speech.transport_speaking
                and speech.silent_for() > speech.timeout_s and not log.pending):
            # (A log that does not take it keeps it noted, which this waits for.)
            if not await _observe(log, SpeechStopped(state.generation, "timeout"),
                                  "the end of speech"):
                pause = 2.0
        state = driver.state
        if (state.connected and not state.interaction_idle
                and time.monotonic() - receiver.last_message > IDLE_TIMEOUT_S
                and not log.pending):
            if not await _observe(log, InteractionStatusObserved(state.generation, "IDLE",
                                                                 "timeout"),
                                  "the model's silence"):
                pause = 2.0


async def _observe(log: LogWriter, observation, what: str) -> bool:
    try:
        await log.log(observation, when=When.ACTED_ON)
    except Exception as exc:  # noqa: BLE001 - never end the watchdog for the call
        logger.exception(f"{log.label}: could not act on {what}: {exc}")
        return False
    return True
