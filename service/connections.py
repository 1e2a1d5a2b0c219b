"""Opening, replacing and retrying the Gemini Live session (a mixin of
DurableGeminiLiveLLMService): the handle each new session resumes from is the log's choice,
a reconnect runs in a task of its own and never from inside the receive loop, a failed
handshake passes its handle over only on evidence, and failures in a row are retried for a
window before the service is given up."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from google.genai import errors as genai_errors
from loguru import logger
from pipecat.services.google.gemini_live.llm import MAX_CONSECUTIVE_FAILURES

from session_store import events as ev
from session_store.decide import RESYNC_KINDS, SpeechStarted

from .wire import guard_session

#: Reconnects that back off when they repeat (see _replace_session).
PACED_REASONS = RESYNC_KINDS | {"error"}
#: Close codes with which the Live API refuses a setup as such, before setupComplete: 1007
#: (INVALID_ARGUMENT, "Request contains an invalid argument") and 1008 (policy violation,
#: "Requested entity was not found"). A resumption handshake closed so is the handle refused
#: (expired, unknown): the same setup cannot succeed, it is passed over at once. Anything else
#: before setupComplete (1011 "Internal error encountered" / "The service is currently
#: unavailable", also seen when a resume races the close of the session's previous socket; a
#: dropped connection; a timeout; an HTTP failure before the setup was even sent) says nothing
#: about the handle: the next try resumes from it again.
REFUSING_CLOSE_CODES = frozenset({1007, 1008})
#: Transient handshake failures in a row with one handle before it is passed over anyway (a
#: server that fails on it every time may be unable to restore it). pipecat gives the service
#: up at its third failure in a row: two leave a try for an older handle or a fresh session.
HANDLE_ATTEMPTS = 2
#: How long connection failures in a row are retried before the service is given up.
#: pipecat gives up at its third failure in a row (about a second of backoff here): a Gemini
#: blip of a few seconds ended the call, its results undelivered.
RECONNECT_WINDOW_S = 30.0
#: Backoff before the next handshake: doubled with each failure in a row, capped.
HANDSHAKE_BACKOFF_S = 0.25
HANDSHAKE_BACKOFF_MAX_S = 2.0


def handshake_refused(error: BaseException) -> bool:
    """Did the server refuse the setup itself (REFUSING_CLOSE_CODES)? google-genai raises an
    APIError whose code is the close code when the socket closes before setupComplete."""
    return isinstance(error, genai_errors.APIError) and error.code in REFUSING_CLOSE_CODES


class SessionConnections:
    """The connection hooks of DurableGeminiLiveLLMService (state set up in its __init__)."""

    async def _connect(self, session_resumption_handle: str | None = None):
        if self._session or self._driver.fenced:
            return
        # pipecat's setup() connects with no handle: use the one the log chose (setup and
        # _replace_session set it, None for a fresh session: upstream also stores every
        # handle a session issues there, which the log may have ruled out).
        handle = session_resumption_handle or self._session_resumption_handle
        if handle in self._bad_handles:
            handle = self._driver.resumption_handle(exclude=self._bad_handles)
        self._connecting_handle = handle
        self._session_resumption_handle = handle  # None means a fresh session, seeded below
        await super()._connect(session_resumption_handle=handle)

    async def _connection_task_handler(self, config):
        try:
            await super()._connection_task_handler(config)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a handshake failure: upstream leaves the service dead
            if self._disconnecting:
                return
            logger.warning(f"{self}: connection failed before setupComplete: {exc}")
            handle = self._connecting_handle
            detail: dict[str, Any] = {"handle": handle, "error": str(exc)[:500]}
            if handle:
                # Only a refusal says the handle is bad. A transient failure (a 1011, a
                # dropped connection) retries it: an older handle, or a fresh session, lacks
                # what the conversation gained since (spoken turns are not sent again).
                refused = handshake_refused(exc)
                failures = self._handle_failures.get(handle, 0) + 1
                self._handle_failures[handle] = failures
                passed_over = refused or failures >= HANDLE_ATTEMPTS
                if passed_over:
                    self._bad_handles.add(handle)  # next try: an older handle or fresh
                detail.update(handle_refused=refused, failures=failures,
                              passed_over=passed_over)
            await self._record_quietly(ev.AnomalyRecorded(
                "handshake_failed", detail, self._driver.state.generation))
            if await self._handle_connection_error(exc):
                await asyncio.sleep(min(
                    HANDSHAKE_BACKOFF_S * 2 ** max(self._failures_in_row - 1, 0),
                    HANDSHAKE_BACKOFF_MAX_S))
                self._session = None
                await self._reconnect_now("handshake_failed")

    async def _handle_connection_error(self, error: Exception) -> bool:
        now = time.monotonic()
        if self._failing_since is None or self._consecutive_failures == 0:
            # (pipecat's count is 0 again once a session or a message went through)
            self._failing_since, self._failures_in_row = now, 0
        self._failures_in_row += 1
        if now - self._failing_since < self._reconnect_window_s:
            # Within the window, pipecat's count stops short of its limit: it would give the
            # service up at its third failure in a row (`reconnect_window_s`).
            self._consecutive_failures = min(self._consecutive_failures,
                                             MAX_CONSECUTIVE_FAILURES - 2)
        go_on = await super()._handle_connection_error(error)
        if not go_on:
            # Upstream gives the service up (MAX_CONSECUTIVE_FAILURES; it pushes an
            # ErrorFrame for the app): the log says so, with what is still undelivered.
            await self._record_quietly(ev.AnomalyRecorded("connection_given_up", {
                "failures": self._failures_in_row, "error": str(error)[:300],
                "undelivered": [c.call_id for c in self._driver.state.undelivered()][:20]},
                self._driver.state.generation))
        return go_on

    async def _handle_session_ready(self, session):
        # Before upstream's receive loop starts: frames the SDK cannot parse are reported
        # and skipped instead of failing the loop (service/wire.py).
        guard_session(session, self._on_rejected_frame, self._max_frame_bytes)
        self._handle_failures.clear()  # a handshake went through: failures are no longer in a row
        state = self._driver.state
        # Logged before the session's first message is read: a log that is down holds the
        # session here until it is back (its messages wait on the socket).
        if not await self._record_when_logged(ev.Connected(
                state.generation + 1, self._connecting_handle,
                hashlib.sha256(str(self._system_instruction_from_init or "").encode())
                .hexdigest())):
            # Fenced (or the call is ending): pipecat has not made it `_session` yet, so
            # nothing else would close it, and its receive loop would feed this pipeline.
            await session.close()
            return
        if self._connecting_handle is not None:
            self._handles_hold_sends = self._driver.state.generation  # resumed: no seed
        if self._old_playback_is_speech():
            # A new session resets "speaking" in the projection, but the transport may still be
            # playing the old session's audio (a reconnect that could not wait for the turn
            # to end): deferred calls keep waiting for the transport to stop. (Noted: decided
            # before anything else is, by the next commit.)
            self._note(SpeechStarted(self._driver.state.generation, "transport"))
        self._bot_is_responding = False
        await super()._handle_session_ready(session)
        await self._perform_due()

    async def _reconnect(self):
        # Upstream calls this on a receive error; route it through the log's choice of handle.
        # From its receive loop, in a task of its own: run inside the connection task, the
        # reconnect's own logging could be cancelled mid-append by a _disconnect of that
        # task (seen with a 1009 close: a second reconnect raced it, two sessions opened).
        if asyncio.current_task() is self._connection_task:
            self._schedule_reconnect("error")
            return
        await self._reconnect_now("error")

    async def _reconnect_now(self, reason: str) -> None:
        if self._reconnecting:  # one at a time: the one under way brings a new session
            return
        self._reconnecting = True
        try:
            await self._replace_session(reason)
        finally:
            self._reconnecting = False

    async def _replace_session(self, reason: str) -> None:
        if reason in PACED_REASONS:
            # A server that garbles or drops every session must not get a reconnect loop at
            # handshake speed: back off with the number of recent ones (never give up: the
            # log keeps every call's result for whichever session comes next).
            now = time.monotonic()
            self._resyncs = [t for t in self._resyncs if now - t < 30.0] + [now]
            await asyncio.sleep(min(0.25 * (len(self._resyncs) - 1), 2.0))
        await self._flush_transcript()  # what was said belongs to the session that heard it
        state = self._driver.state
        if state.connected:
            events: list[ev.Event] = [ev.Disconnected(state.generation, reason)]
            if self._old_playback_is_speech():
                # The projection takes a disconnect as the end of speech, but the transport
                # is still playing what the old session sent (a reconnect that could not wait
                # for the turn, e.g. a goAway deadline): deferred calls keep waiting for it.
                events.append(ev.BotStartedSpeaking(state.generation, "transport"))
            if not await self._record_when_logged(*events):
                return  # fenced (the session is being closed) or the call is ending
        # A new session must carry the settings as they are now (upstream sends the old prompt).
        if self._settings.system_instruction is not None:
            self._system_instruction_from_init = self._settings.system_instruction
        cut = self._bot_is_responding  # a model turn under way, its turnComplete never to come
        await self._disconnect()
        self._bot_is_responding = False
        if cut:
            # pipecat sends no TTSStoppedFrame for a turn the reconnect cut, so the transport
            # plays it and the next session's first turn as one stretch (one stop), or ends
            # it on its silence fallback: one stop stands for both turns. Counted as two,
            # that stop and every later one (one turn short for good) were not silence, and
            # deferred calls waited for the watchdog (tests/service/test_turn_cut_by_reconnect.py).
            self._model_turns -= 1
            self._turns_played = min(self._turns_played, self._model_turns)
        if self._driver.fenced or state.closed:
            return
        handle = self._driver.resumption_handle(exclude=self._bad_handles)
        self._session_resumption_handle = handle  # the log's choice, a fresh session included
        await self._connect(session_resumption_handle=handle)

    def _old_playback_is_speech(self) -> bool:
        """Across a reconnect, whether the transport still playing the old session's audio
        counts as the bot speaking. Only when the transport is the speaking signal: in
        "model" mode its stop is not counted, so nothing but the watchdog would end that
        speech (a deferred result waited for it: tests/service/test_speech_signals.py)."""
        return self._transport_speaking and self._speaking_signal == "transport"

    def _schedule_reconnect(self, reason: str) -> None:
        """Reconnect in a task of its own: never from inside the receive loop."""
        if self._reconnect_task and not self._reconnect_task.done():
            return
        self._reconnect_task = self.create_task(self._reconnect_now(reason), "planned_reconnect")

    def _link_busy(self) -> bool:
        reconnecting = self._reconnecting or (self._reconnect_task is not None
                                              and not self._reconnect_task.done())
        handshaking = self._session is None and self._connection_task is not None
        return reconnecting or handshaking or self._awaiting_seed()
