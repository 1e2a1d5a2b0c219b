"""The bot's speech into the call's log: what the service sees of it (the model's turns,
the output transport's frames) becomes SpeechStarted / SpeechStopped observations, when the
SpeechTracker says it is the bot's speech to report (speaking_signal)."""

from __future__ import annotations

from pipecat.frames.frames import BotStartedSpeakingFrame, BotStoppedSpeakingFrame, Frame

from session_store.decide import SpeechStarted, SpeechStopped
from session_store.delivery import waits_for_silence

from .driver import CallDriver
from .log_writer import LogWriter, When
from .speech import SpeechTracker


class SpeechLog:
    """Reports the bot's speech to the log, for one service."""

    def __init__(self, driver: CallDriver, log: LogWriter, speech: SpeechTracker):
        self._driver = driver
        self._log = log
        self._speech = speech

    async def model_responding(self) -> None:
        """Upstream sets `_bot_is_responding` right before pushing a turn's first audio
        frame: noted (logged before anything decided after it), not waited for here."""
        self._speech.heard()
        await self._log.log(SpeechStarted(self._driver.state.generation, "model"),
                            when=When.LAZY)

    async def transport_frame(self, frame: Frame) -> None:
        """The output transport's speech changes (frames going upstream)."""
        # Noted, not awaited: system frames share one task with the user's microphone
        # audio, which must not wait for the database (seen: while PostgreSQL restarted, an
        # awaited stop held the user's audio back for the rest of the outage). A noted fact
        # is also never dropped when its append fails: it stays queued, in order, until the
        # log takes it (an awaited one was lost with the error). With speaking_signal="model"
        # the transport's frames only hold the watchdog off: the model's turn decides.
        # Counting both made the outcome depend on frame timing (seen under load: the
        # transport's start, noted after the turnComplete that ended the turn, began the
        # speech again and held a deferred call 2 s, until playback ended).
        if isinstance(frame, BotStartedSpeakingFrame):
            if self._speech.transport_started():
                await self._log.log(SpeechStarted(self._driver.state.generation, "transport"),
                                    when=When.LAZY)
        elif isinstance(frame, BotStoppedSpeakingFrame):
            if self._speech.transport_stopped():
                await self.stopped("transport")

    async def stopped(self, source: str) -> None:
        """Logged at once if a call or a reconnect waits for it, else lazily (it then shares
        the next commit, and the one after the turn stays free for a toolCall)."""
        await self._log.log(
            SpeechStopped(self._driver.state.generation, source),
            when=When.SOON if waits_for_silence(self._driver.state) else When.LAZY)
