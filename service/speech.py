"""What the service knows of the bot's speech between the log's facts: the output transport's
own view, the model's turns under way, and when anything was last heard.

The log decides from BotStarted/StoppedSpeaking; this tracker says when the service has such
a fact to report. No I/O, no pipecat: the service feeds it what it sees.
"""

from __future__ import annotations

import time
from typing import Literal


class SpeechTracker:
    """speaking_signal "transport": the bot speaks from the first model audio until the
    output transport stopped after playing every turn begun; "model": until turnComplete
    (the transport's frames then only hold the watchdog off)."""

    def __init__(self, signal: Literal["transport", "model"], timeout_s: float):
        self.signal = signal
        self.timeout_s = timeout_s  # no output and no transport signal this long: silent
        self.last_activity = 0.0
        #: Between the output transport's BotStarted and BotStoppedSpeakingFrame.
        self.transport_speaking = False
        #: A model turn is under way on the wire (output since its last turnComplete). Not
        #: pipecat's `_bot_is_responding`, which a thinking model's held turnComplete keeps
        #: True until the session says IDLE.
        self.model_generating = False
        # Model turns with output begun, and how many of them the transport finished playing.
        self._turns = 0
        self._played = 0

    def heard(self) -> None:
        """Model output, or the transport starting: not silence."""
        self.last_activity = time.monotonic()

    def silent_for(self) -> float:
        return time.monotonic() - self.last_activity

    def turn_began(self) -> None:
        self._turns += 1

    def server_content(self, turn_complete: bool, interrupted: bool, output: bool) -> None:
        if turn_complete or interrupted:
            self.model_generating = False
        elif output:
            self.model_generating = True

    def interrupted(self) -> None:
        """The transport drops the audio queued: every turn begun counts as played."""
        self._played = self._turns

    def transport_started(self) -> bool:
        """The transport started playing; True if that is the bot's speech to report."""
        self.transport_speaking = True
        self.heard()
        return self.signal == "transport"

    def transport_stopped(self) -> bool:
        """The transport stopped; True if that is the end of the bot's speech to report.

        Gemini streams faster than real time: when a turn's playback ends (its
        TTSStoppedFrame), the next turn's audio may already be queued behind it, and the
        transport starts again at once. That stop is not silence (seen on the wire: it let a
        goAway reconnect cut the next turn). A stop without a turnComplete (the transport's
        silence fallback while 3.x holds turnComplete) ends the current turn, so it counts
        too: no deadlock."""
        self.transport_speaking = False
        if self.signal != "transport":
            return False
        self._played = min(self._played + 1, self._turns)
        return self._played >= self._turns

    def session_replaced(self, turn_cut: bool) -> None:
        """A reconnect closed the session. pipecat sends no TTSStoppedFrame for a turn it
        cut, so the transport plays it and the next session's first turn as one stretch (one
        stop), or ends it on its silence fallback: one stop stands for both turns. Counted as
        two, that stop and every later one (one turn short for good) were not silence, and
        deferred calls waited for the watchdog (tests/service/test_turn_cut_by_reconnect.py)."""
        if turn_cut:
            self._turns -= 1
            self._played = min(self._played, self._turns)

    def session_ready(self) -> None:
        """A new session: no model turn of its own is under way yet."""
        self.model_generating = False

    @property
    def old_playback_is_speech(self) -> bool:
        """Across a reconnect, whether the transport still playing the old session's audio
        counts as the bot speaking. Only when the transport is the speaking signal: in
        "model" mode its stop is not counted, so nothing but the watchdog would end that
        speech (a deferred result waited for it: tests/service/test_speech_signals.py)."""
        return self.transport_speaking and self.signal == "transport"
