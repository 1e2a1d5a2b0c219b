"""The link to Gemini Live: which handle a new session resumes from, reconnects (one at a
time, in a task of their own, never from inside the receive loop), handshakes that fail
(a handle passed over only on evidence, decided on the log) and failures in a row retried
for a window before the connection is given up, which is decided on the log too
(decide.gives_up). pipecat's connection hooks stay in the service, which hands them here;
what goes to the log is decided on it (decide.SessionReady, SessionLeft, HandshakeFailed)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from google.genai import errors as genai_errors
from loguru import logger

from session_store.cut_notes import replacing_for_cut
from session_store.decide import RESYNC_KINDS, HandshakeFailed, SessionLeft, SessionReady
from session_store.delivery import Reconnect

from .caller_audio import CallerAudioHold
from .log_writer import LogWriter, When
from .port import ServicePort
from .seeding import Seeder
from .speech import SpeechTracker

#: Reconnects that back off when they repeat (see `_replace`).
PACED_REASONS = RESYNC_KINDS | {"error"}
#: How long connection failures in a row are retried before the connection is given up
#: (decided on the log: decide.gives_up, which the observations carry it to).
#: pipecat gives up at its third failure in a row (about a second of backoff here): a Gemini
#: blip of a few seconds ended the call, its results undelivered.
RECONNECT_WINDOW_S = 30.0
#: Backoff before the next handshake: doubled with each failure in a row, capped.
HANDSHAKE_BACKOFF_S = 0.25
HANDSHAKE_BACKOFF_MAX_S = 2.0


def handshake_failure(handle: str | None, error: BaseException,
                      window_s: float | None = None) -> HandshakeFailed:
    """A failed handshake as observed: google-genai raises an APIError whose code is the
    close code (its details the close reason) when the socket closes before setupComplete.
    Whether that code refuses the handle is decided on the log (decide.REFUSING_CLOSE_CODES)."""
    code, reason = None, ""
    if isinstance(error, genai_errors.APIError) and isinstance(error.code, int):
        code = error.code
        reason = str(error.details if isinstance(error.details, str) else error.message or "")
    return HandshakeFailed(handle, str(error)[:500], code, reason[:300],
                           give_up_after_s=window_s)


class Link:
    """The session's connection state, for one service (its pipecat side: `svc`)."""

    def __init__(self, svc: ServicePort, log: LogWriter, speech: SpeechTracker, seeder: Seeder,
                 flush_transcript: Callable[..., Awaitable[None]], window_s: float,
                 caller_audio: CallerAudioHold, forget_caller_words: Callable[[float], None]):
        self._svc = svc
        self._caller_audio = caller_audio
        self._forget_caller_words = forget_caller_words
        self._driver = svc.driver
        self._log = log
        self._speech = speech
        self._seeder = seeder
        self._flush_transcript = flush_transcript
        self._window_s = window_s
        self.connecting_handle: str | None = None
        #: The live session got a server message (which ends a run of failures in the log).
        self.heard = False
        self._task: asyncio.Task | None = None
        self._reconnecting = False  # a reconnect is under way (whichever task runs it)
        self._resyncs: list[float] = []  # when recent paced reconnects happened

    # ------------------------------------------------------------------ handshakes
    def handle_for(self, requested: str | None) -> str | None:
        """The handle the next handshake uses: `requested` (the log's choice), unless the
        server refused it since (then an older one, or None for a fresh session)."""
        handle = None if requested is None else self._driver.resumption_handle(requested)
        self.connecting_handle = handle
        return handle

    async def handshake_failed(self, exc: Exception) -> None:
        """Logged, and decided on the log (decide.HandshakeFailed): whether the handle is
        passed over, for whichever worker picks the next one, counts the failures in a row
        the log holds."""
        await self._log.log(handshake_failure(self.connecting_handle, exc, self._window_s),
                            when=When.KEPT)
        if await self._svc._handle_connection_error(exc):
            await asyncio.sleep(min(
                HANDSHAKE_BACKOFF_S * 2 ** max(self._driver.state.failures_in_row - 1, 0),
                HANDSHAKE_BACKOFF_MAX_S))
            # (pipecat connects only where it holds no session)
            self._svc.apply(replace(self._svc.pipecat_state, session=None))
            await self.reconnect_now("handshake_failed")

    async def lost(self, error: Exception) -> None:
        """The receive loop lost the live session to `error`: left, and whether that ends the
        window of failures in a row decided on the log, before pipecat reconnects or gives
        up (a failed handshake was decided as such already: no session is live then)."""
        state = self._driver.state
        if not state.connected or state.closed:
            return
        await self._flush_transcript()  # what was said belongs to the session that heard it
        await self._log.log(SessionLeft(
            state.generation, "error", self._speech.old_playback_is_speech, self.heard,
            self._window_s, str(error)[:300]), when=When.DURABLE)

    @property
    def given_up(self) -> bool:
        """The log gave the connection up (decide.gives_up): pipecat is to stop."""
        return self._driver.state.given_up

    async def session_ready(self) -> bool:
        """Log the new session before its first message is read (a log that is down holds it
        here, its messages waiting on the socket). False: fenced, or the call is ending."""
        svc = self._svc
        self.heard = False
        prompt = str(svc.pipecat_state.system_instruction_from_init or "")
        return await self._log.log(SessionReady(
            self._driver.state.generation + 1, self.connecting_handle,
            hashlib.sha256(prompt.encode()).hexdigest(),
            self._speech.old_playback_is_speech), when=When.DURABLE)

    # ------------------------------------------------------------------ reconnects
    def _still_due(self, state) -> bool:
        """Is a reconnect still due on the log as it is (the notes not in yet)? Asked before
        the transcript is flushed, not to cut the bot's words in two for a reconnect that
        waits; the log decides for good (decide.SessionLeft)."""
        return any(isinstance(e, Reconnect) for e in self._driver.due())

    @property
    def busy(self) -> bool:
        """A reconnect or a handshake is under way, or a fresh session awaits its seed."""
        svc = self._svc
        reconnecting = self._reconnecting or (self._task is not None and not self._task.done())
        handshaking = svc._session is None and svc._connection_task is not None
        return reconnecting or handshaking or self._seeder.awaiting_seed()

    @property
    def up(self) -> bool:
        """A session can carry a send now."""
        return not (self._svc._session is None or self._svc._disconnecting or self.busy)

    def schedule(self, reason: str, *, planned: bool = False) -> None:
        """Reconnect in a task of its own: never from inside the receive loop. `planned`:
        one `due` found due (its leave is decided again when logged: decide.SessionLeft)."""
        if self._task and not self._task.done():
            return
        self._task = self._svc._spawn(self.reconnect_now(reason, planned=planned),
                                      "planned_reconnect")

    async def reconnect_now(self, reason: str, *, planned: bool = False) -> None:
        if self._reconnecting:  # one at a time: the one under way brings a new session
            return
        self._reconnecting = True
        try:
            await self._replace(reason, planned)
        finally:
            self._reconnecting = False

    async def _replace(self, reason: str, planned: bool = False) -> None:
        svc = self._svc
        if reason in PACED_REASONS:
            # A server that garbles or drops every session must not get a reconnect loop at
            # handshake speed: back off with the number of recent ones (never give up: the
            # log keeps every call's result for whichever session comes next).
            now = time.monotonic()
            self._resyncs = [t for t in self._resyncs if now - t < 30.0] + [now]
            await asyncio.sleep(min(0.25 * (len(self._resyncs) - 1), 2.0))
        state = self._driver.state
        if planned and not self._still_due(state):
            return  # (what made it wait makes it due again: due schedules it then)
        # What was said belongs to the session that heard it; but the caller's, when this
        # replaces a session that said a cut turn, may go again to the next one (below).
        interrupted_at = (self._caller_audio.interrupted_at if replacing_for_cut(state)
                          else None)
        await self._flush_transcript(caller_words=interrupted_at is None)
        generation = state.generation
        # (No reconnect window: only a session lost to an error can end in a give-up.)
        if state.connected and not await self._log.log(SessionLeft(
                generation, reason, self._speech.old_playback_is_speech, self.heard,
                if_due=planned), when=When.DURABLE):
            return  # fenced (the session is being closed) or the call is ending
        state = self._driver.state
        if planned and state.connected and state.generation == generation:
            # The log did not leave: what was committed since the reconnect was found due (the
            # bot speaking again, a toolCall) makes it wait, decided on the state it was
            # logged on. Whatever makes it due again has `due` schedule it then.
            logger.info(f"{svc}: the {reason} reconnect waits: no longer due when logged")
            return
        # A new session must carry the settings as they are now (upstream sends the old prompt).
        before = svc.pipecat_state.with_current_prompt()
        svc.apply(before)
        await svc._disconnect()
        svc.apply(replace(svc.pipecat_state, bot_is_responding=False))
        # (a model turn was under way: its turnComplete is never to come)
        self._speech.session_replaced(turn_cut=before.bot_is_responding)
        if self._driver.fenced or state.closed:
            return
        # The old session is gone (what the caller says now is held): if it had not answered
        # the caller who cut its turn, the new one hears them from the start (caller_audio.py)
        # and transcribes it; their words not sent again go to the log with the next flush.
        if interrupted_at is not None and self._caller_audio.replay_since(interrupted_at):
            self._forget_caller_words(interrupted_at)
        handle = self._driver.resumption_handle()
        # The log's choice, a fresh session included.
        svc.apply(replace(svc.pipecat_state, session_resumption_handle=handle))
        await svc._connect(session_resumption_handle=handle)
