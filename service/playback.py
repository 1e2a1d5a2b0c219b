"""What the service reads of the caller's playback, to log what the caller heard.

Gemini Live transcribes everything the model generated, and its audio reaches the caller
later than it reaches the worker (the transport plays it in real time, the telephony
provider buffers more). A pipeline that knows its playback position (the phone bot: Twilio
`mark`s echoed once the audio before them played, examples/phone_bot/playback.py) sets the
service's `playback` to an object with `heard_fraction()`: the part of the current turn's
audio played so far, or None when unknown, and `finished_turn_heard()`: the same for the
model's last finished turn while it is still playing. On an interruption the service
observes both (`InterruptionObserved`, `TranscriptFlushed`), and the log decides the cut of
the bot's turn (session_store/heard.py): a turn under way (Gemini's `interrupted`) is logged
cut; one the model had finished, and logged whole, gets its message cut after it
(`conversation.message_cut`).
"""

from __future__ import annotations

from typing import Protocol


class PlaybackPosition(Protocol):
    def heard_fraction(self) -> float | None:
        """Of the audio of the bot's current turn, the part the caller heard (0..1)."""

    def finished_turn_heard(self) -> float | None:
        """Of the audio of the model's last finished turn, the part the caller heard, while
        they are still hearing it; None once it played in full (or no turn finished)."""
