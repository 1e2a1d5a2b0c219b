"""What the service reads from Gemini, as facts for the log: resumption handles and the
model output that shows what it read (handle_gate.py), goAway, cancellations, interaction status, barge-ins,
transcripts and frames the SDK could not take in. Called from pipecat's receive loop, which
carries the audio too: facts are noted rather than awaited, except the ones stock pipecat
acts on there (a toolCall, a goAway, a cancellation), logged right there but bounded."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from loguru import logger

from session_store import events as ev
from session_store.decide import (CancellationArrived, FunctionCall, GoAway,
                                  InteractionStatusObserved, InterruptionObserved,
                                  ServerMessageRejected, ToolCallsArrived, TranscriptFlushed,
                                  cancelled_with)
from session_store.delivery import waits_for_idle

from .caller_audio import CallerAudioHold
from .driver import now_us
from .effects import EffectRunner
from .handle_gate import HandleGate, Incoming
from .log_writer import LogWriter, When
from .playback import PlaybackPosition
from .port import ServicePort
from .setup_context import SetupContext
from .speech import SpeechTracker
from .translate import jsonable
from .wire import Rejection

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*s?\s*$")
_RATE = re.compile(r"rate=(\d+)")


def parse_time_left(value: Any) -> float:
    """goAway.timeLeft arrives as a protobuf Duration string such as "3s" (or "1.5s")."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "total_seconds"):
        return float(value.total_seconds())
    match = _DURATION.match(str(value))
    return float(match.group(1)) if match else 0.0


class Receiver:
    """Turns server messages into the call's facts, for one service (pipecat's side: `svc`)."""

    def __init__(self, svc: ServicePort, log: LogWriter, speech: SpeechTracker,
                 handles: HandleGate, effects: EffectRunner, setup: SetupContext,
                 caller_audio: CallerAudioHold):
        self._svc = svc
        self._caller_audio = caller_audio
        self._setup = setup
        self._driver = svc.driver
        self._log = log
        self._speech = speech
        self._effects = effects
        self.handles = handles
        self.last_message = time.monotonic()
        # What was said since the last flush: the caller's words, each with the seconds since
        # the bot's last message when it arrived (session_store.heard decides which are
        # late), and the bot's.
        # (Each also with when it arrived, monotonic: `forget_caller_words`.)
        self._words: list[tuple[str, float | None, float]] = []
        self._said: list[str] = []
        # The model's audio since the last flush: how long, and when its first part came.
        self._said_audio_s = 0.0
        self._said_audio_from_us: int | None = None
        # When the bot's last message was flushed (monotonic); None once the model goes on.
        self._answered_at: float | None = None
        self._unknown_logged: set[str] = set()  # unknown message fields already logged

    async def message(self, message) -> None:
        gen = self._driver.state.generation
        self.last_message = time.monotonic()
        update = message.session_resumption_update
        sc = message.server_content
        handle = update.new_handle if update and update.resumable else None
        await self.handles.receive(Incoming(
            gen, handle, update.last_consumed_client_message_index if handle else None,
            reaction=message.tool_call is not None or (sc is not None and bool(
                sc.model_turn or sc.output_transcription or sc.turn_complete)),
            turn_ended=sc is not None and bool(sc.turn_complete or sc.interrupted)))
        if sc is not None:
            self._speech.server_content(bool(sc.turn_complete), bool(sc.interrupted),
                                      bool(sc.model_turn or sc.output_transcription))
        if message.go_away is not None:
            await self._go_away(gen, parse_time_left(message.go_away.time_left))
        if message.tool_call_cancellation is not None:
            await self._cancellation(gen, tuple(message.tool_call_cancellation.ids or ()))
        if sc is not None:
            await self._server_content(gen, sc)

    async def _go_away(self, gen: int, time_left: float) -> None:
        # In the receive loop, bounded while the database is down; the time left is counted
        # down to the goAway's record time (decide.GoAway).
        read = time.monotonic()
        await self._log.log(GoAway(gen, time_left, now_us()), when=When.HERE)
        # Due `margin` before the deadline, counted from the read: a wait for the log (a
        # commit ahead of this one) comes out of the timer, not out of the margin.
        margin = self._driver.policy.go_away_margin_s
        waited = time.monotonic() - read
        self._svc._spawn(self._effects.due_after(max(time_left - margin - waited, 0.0)),
                         "go_away_deadline")

    async def _cancellation(self, gen: int, ids: tuple) -> None:
        self._effects.cancelled_on_wire.update(i for i in ids if isinstance(i, str))
        # What runs for them: each call, or the original a re-issued id waits for.
        running = [c.call_id for c in cancelled_with(self._driver.state, ids)
                   if c.status == "started"]
        # Logged here, bounded while the database is down; if it is only noted, it is still
        # logged before anything else is decided, so no cancelled call starts (and a start
        # being committed meanwhile does not run: EffectRunner.run_started). Stopping a
        # running one is this process's own business: done at once.
        await self._log.log(CancellationArrived(ids, gen), when=When.HERE)
        for call_id in running:  # already running: stop it if pipecat can
            await self._svc._cancel_function_calls_by_tool_call_id(call_id)

    async def _server_content(self, gen: int, sc) -> None:
        status = getattr(sc, "interaction_status", None)
        if status is not None:
            value = getattr(status, "value", status)
            idle = value in ("IDLE", "REQUIRES_ACTION")  # (the SDK's older name for IDLE)
            if idle or value == "IN_PROGRESS":
                # Noted (the receive loop carries the audio); at once if a reconnect waits
                # for the model to go idle.
                await self._log.log(
                    InteractionStatusObserved(gen, "IDLE" if idle else "IN_PROGRESS"),
                    when=When.SOON if waits_for_idle(self._driver.state) else When.LAZY)
        if sc.interrupted:
            self._speech.interrupted()  # the transport drops the queued audio
            self._caller_audio.caller_interrupted()
            # Noted, not awaited: this is the receive loop, and the model's next audio is
            # behind it (seen: while PostgreSQL restarted, the answer to a barge-in played
            # only once the database was back). The model's previous turn may still have
            # been playing: the log decides whether its message is cut too.
            playback = self._svc.playback
            await self._log.log(InterruptionObserved(
                gen, finished_turn_heard=_finished_heard(playback)))
            if playback is not None:  # the turn ends here, as far as it was heard
                heard = playback.heard_fraction()
                if heard is not None:
                    logger.info(f"{self._svc}: the caller heard {heard:.0%} of the bot's "
                                "interrupted turn")
                await self.flush_transcript(heard)
        if sc.model_turn:
            self._speech.heard()
            self._caller_audio.model_responded()  # (after an interruption: its answer)
            seconds = audio_seconds(sc.model_turn)
            if seconds and self._said_audio_from_us is None:
                self._said_audio_from_us = time.time_ns() // 1000
            self._said_audio_s += seconds
        if sc.input_transcription and sc.input_transcription.text:
            since = (None if self._answered_at is None
                     else round(time.monotonic() - self._answered_at, 3))
            self._words.append((sc.input_transcription.text, since, time.monotonic()))
        if sc.model_turn or sc.output_transcription:
            self._answered_at = None  # the model goes on: no answer stands for later words
        if sc.output_transcription and sc.output_transcription.text:
            self._said.append(sc.output_transcription.text)

    def _flushed(self, heard: float | None = None, caller_words: bool = True
                 ) -> list[TranscriptFlushed]:
        """What was said since the last flush, to be decided into messages on the log
        (`heard`: the part of an interrupted turn's audio the caller heard); [] if nothing.
        `caller_words` False: the caller's stay for the next flush (or `forget_caller_words`)."""
        words = tuple((text, since) for text, since, _ in self._words) if caller_words else ()
        said = "".join(self._said).strip()
        audio_s, self._said_audio_s = self._said_audio_s, 0.0
        audio_from, self._said_audio_from_us = self._said_audio_from_us, None
        if caller_words:
            self._words.clear()
        self._said.clear()
        if not words and not said:
            return []
        if said:
            self._answered_at = time.monotonic()
        audio = (round(audio_s, 3), audio_from) if said and audio_s else (None, None)
        return [TranscriptFlushed(self._driver.state.generation, words, said, heard, *audio)]

    async def pipeline_interruption(self) -> None:
        """pipecat interrupts the bot (a local voice detector heard the caller). With a model
        turn under way Gemini decides (its `interrupted`); after it, the audio still playing
        stops here, and the log keeps what was heard (decided there). Without a finished
        turn still playing there is nothing to decide on: nothing is logged."""
        heard = _finished_heard(self._svc.playback)
        if heard is None:
            return
        await self._log.log(InterruptionObserved(
            self._driver.state.generation, local=True,
            model_turn=self._speech.model_generating, finished_turn_heard=heard))

    async def flush_transcript(self, heard: float | None = None, *,
                               caller_words: bool = True) -> None:
        """What was said (at the turn's end, an interruption, or a session's end)."""
        flushed = self._flushed(heard, caller_words)
        if flushed:
            await self._log.log(*flushed)

    def forget_caller_words(self, since: float) -> None:
        """The caller's words not flushed yet that arrived from `since` (monotonic) on: their
        audio went again to the next session, which transcribes it (caller_audio.py).
        Earlier ones (a question's words transcribed late) stay for the next flush."""
        self._words = [word for word in self._words if word[2] < since]

    async def tool_call(self, message) -> None:
        gen = self._driver.state.generation
        svc = self._svc
        calls = tuple(
            # Vertex sends no ids: make one, as upstream does, and persist it with the call
            # (the Gemini API always should: there the log also records the anomaly).
            FunctionCall(f.id or f"gen{gen}-{uuid.uuid4()}", f.name, jsonable(f.args or {}),
                         id_generated=not f.id,
                         has_handler=bool(f.name) and svc.has_function(f.name),
                         declared=self._setup.declared.get(f.name) if f.name else None)
            for f in (message.tool_call.function_calls or []))
        if calls:
            # Decided and logged with the start of every call now due (one commit), in order
            # with everything noted before, right here unless the log is busy; a database
            # that is down holds the audio behind the toolCall only briefly (When.HERE).
            # What the bot said before it asked goes first: a seed or catch-up then holds
            # what the caller heard ("let me refund that"), in the order they heard it.
            await self._log.log(*self._flushed(), ToolCallsArrived(calls, gen),
                                when=When.HERE)
        else:
            await self._log.log(ev.AnomalyRecorded("empty_tool_call", {}, gen))

    async def rejected(self, rejection: Rejection) -> None:
        """A frame the SDK could not parse (or parsed leaving fields out): logged; whether
        the session is resynced for it is decided on the log (decide.RESYNC_KINDS)."""
        if rejection.once is not None:
            if rejection.once in self._unknown_logged:
                return
            self._unknown_logged.add(rejection.once)
        logger.warning(f"{self._svc}: server frame not taken in ({rejection.kind}): "
                       f"{str(rejection.detail)[:300]}")
        await self._log.log(ServerMessageRejected(rejection.kind, rejection.detail,
                                                  self._driver.state.generation))


def audio_seconds(content) -> float:
    """How long the audio in a model turn's parts is (Gemini Live sends 16-bit PCM, its rate
    in the mime type: `audio/pcm;rate=24000`)."""
    seconds = 0.0
    for part in content.parts or ():
        blob = part.inline_data
        if blob is None or not blob.data or not (blob.mime_type or "").startswith("audio/pcm"):
            continue
        rate = _RATE.search(blob.mime_type)
        hz = int(rate.group(1)) if rate else 24000
        seconds += len(blob.data) / 2 / hz if hz > 0 else 0.0
    return seconds


def _finished_heard(playback: PlaybackPosition | None) -> float | None:
    """Of the model's last finished turn still playing, the part the caller heard."""
    return playback.finished_turn_heard() if playback is not None else None
