"""Deciding and acting: how DurableGeminiLiveLLMService turns the log into actions.

A mixin of the service (split out of gemini_live.py to keep each part readable). Every
action follows one rule: the fact or the intent is committed to the log first, then it is
performed; what is due is computed by the pure `session_store.decide.due` on the projection.
Live operation and takeover after a crash both go through `_perform_due`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from google.genai.types import Content, FunctionResponse, Part
from loguru import logger
from pipecat.adapters.llm.services.gemini_adapter import GeminiLLMAdapter
from pipecat.frames.frames import (FunctionCallCancelFrame, FunctionCallFromLLM,
                                   FunctionCallResultFrame)
from pipecat.processors.frame_processor import FrameDirection
from websockets.exceptions import ConnectionClosed

from session_store import events as ev
from session_store.decide import (OUTCOME_UNKNOWN, Reconnect, ResolveInDoubt, SendResult,
                                  StartCall, due, result_as_content, result_value,
                                  waits_for_silence)
from session_store.errors import Fenced, StoreUnavailable

from .driver import now_us, unstorable_anomaly, why_unstorable


def jsonable(value: Any) -> Any:
    """A tool result as plain JSON (what the log stores and the model is told)."""
    return json.loads(json.dumps(value, default=str))


# Backoff of the task that logs noted facts while the log is unavailable (each try itself
# waits up to the store's append_timeout).
NOTES_RETRY_FIRST_S, NOTES_RETRY_MAX_S = 0.25, 2.0
# How long a database that refuses appends may hold the receive loop for a fact logged there
# (`_log_now`), counted as the store's append deadline (checked when an attempt fails): then
# the notes task retries it, and the audio behind it flows.
LOG_NOW_TIMEOUT_S = 0.2
# How long a lazy note (a fact that decides nothing now: speech started, a resumption handle,
# a send confirmed, a stop nothing waits for) may wait, on a store that commits urgent appends
# inline, to share the next commit before the notes task logs it on its own
# (bench/turn_overhead.py: committed at once, such a fact occupied the log when the next
# toolCall came, and that toolCall waited for it). Decisions never lag: every commit stages
# the notes before anything it decides.
LAZY_NOTE_WAIT_S = 0.05
# The answer for a call pipecat stopped before it returned (its timeout, or the app).
STOPPED_ERROR = ("stopped before it returned a result (it ran past its timeout, or the "
                 "application cancelled it); it may or may not have taken effect. Check "
                 "before retrying.")


class DueEffects:
    """Observe → commit → act, for DurableGeminiLiveLLMService (uses its driver and session)."""

    # ------------------------------------------------------------------ observations
    async def _observe(self, obs) -> None:
        # The observation and the calls it lets start: one commit, then they run. (No
        # effects lock: the driver's lock makes the start decision and its record one
        # step, so no other task can start the same call; and a note must not wait
        # behind a seed or a send.)
        started = await self._log_kept(obs, then=self._starts_now)
        if started is None:
            return
        await self._run_started(started)
        await self._perform_due()

    async def _log_kept(self, *items, then=None) -> list[ev.Event] | None:
        """Log facts (observations, events) noted first: a log that refuses them keeps them
        in the notes, and the notes task logs them once it is back; never raised (an
        observation handed to the append itself was lost with its exception: a prompt
        change made during an outage never reconnected, tests/faults/test_effect_retry.py).
        Returns what `then` decided, or None if nothing was logged (kept, or fenced)."""
        for item in items:
            self._driver.note(item)
        try:
            return await self._driver.flush(then=then)
        except Fenced:
            await self._on_fenced()
        except Exception as exc:  # noqa: BLE001 - kept in the notes: the task retries
            logger.error(f"{self}: call {self.call_id}: the log did not take {items!r}; kept "
                         f"and retried: {type(exc).__name__}: {exc}")
            self._ensure_notes_task()
        return None

    def _note(self, item, *, lazy: bool = False) -> None:
        """Log a fact in order without waiting for it; a task appends it (with the calls it
        lets start) unless another append takes it along first. A `lazy` fact decides
        nothing by itself: the task waits up to LAZY_NOTE_WAIT_S for another append to take
        it along, so it does not hold the log when something that matters comes. (Lazy or
        not, every fact is decided in order with the next commit: an append never skips a
        note ahead of it.)"""
        self._driver.note(item)
        # Only where the store says it pays (SQLite): until stop 14 SQLite's writer was a
        # thread, and a toolCall committed at once amid the audio that came with it waited
        # longer for the GIL (3 ms median against 1 ms, traced) than behind the confirmation
        # committed before it; in its writer process it waits for no GIL.
        self._ensure_notes_task(lazy=lazy and self._driver.store.lazy_facts)

    def _ensure_notes_task(self, *, lazy: bool = False) -> None:
        if not lazy:
            self._notes_due.set()
        if self._notes_task is None or self._notes_task.done():
            self._notes_task = self.create_task(self._flush_notes(), "log_notes")

    def _after_commit(self, state) -> None:
        """The driver committed: lazy notes still queued must go now if something waits for
        the bot's silence (a call deferred by this very commit, with a stop noted lazily
        while it was under way, must not wait LAZY_NOTE_WAIT_S for it)."""
        if self._driver.has_notes and waits_for_silence(state):
            self._ensure_notes_task()

    async def _log_now(self, item) -> None:
        """Log a fact right here (the receive loop), with the calls it lets start, and start
        them: for a toolCall, what stock pipecat does in the receive loop too; a goAway and a
        toolCallCancellation the same way (they used to hold the receive loop, and the audio
        behind it, for as long as a database outage lasted).

        Through the notes task, a toolCall waited for the loop to get round to that task,
        behind the processing of the audio that came with it (0.5–1 ms per call:
        bench/turn_overhead.py). Only when nothing holds the log (else the note waits its
        turn with the notes task, as any note, and so does one while the log is in doubt),
        and bounded: a database that refuses appends holds the receive loop, and the audio
        behind it, LOG_NOW_TIMEOUT_S more at most once an attempt failed, one that does not
        answer (a partitioned network) the store's `min_attempt_s`; then the notes task
        takes the note over and retries."""
        self._driver.note(item)
        if self._driver.busy or self._driver.stale:
            # Stale: an append failed, and the state must be read again first: a read the
            # database may not answer for a while (read_timeout). Not in the receive loop.
            self._ensure_notes_task()
            return
        try:
            started = await self._driver.flush(then=self._starts_now, timeout=LOG_NOW_TIMEOUT_S)
            await self._run_started(started)
        except Fenced:
            await self._on_fenced()
            return
        except Exception as exc:  # noqa: BLE001 - the notes are kept: the task retries
            logger.warning(f"{self}: call {self.call_id}: logging in the receive loop failed "
                           f"({type(exc).__name__}: {exc}); the notes task retries")
            self._ensure_notes_task()
            return
        # Anything else now due (a result waiting for this session, ...) is not the receive
        # loop's business: it may wait for the log.
        self.create_task(self._perform_due(), "perform_due")

    async def _flush_notes(self) -> None:
        delay = NOTES_RETRY_FIRST_S
        if not self._notes_due.is_set():  # only lazy notes: give an append time to take them
            self._notes_waiting = True
            try:
                await asyncio.wait_for(self._notes_due.wait(), LAZY_NOTE_WAIT_S)
            except TimeoutError:
                pass
            finally:
                self._notes_waiting = False
        try:
            # Until no note is left: one noted while this task performs what is due would
            # find it still running, start no flush of its own, and wait for the next
            # append (seen: a toolCall that arrived while the previous result was being
            # sent stayed unlogged, and unanswered, while the server waited for it).
            # Also while the state is stale: an effect's own append failed (a start, a send
            # intent), and nothing is due until the log is re-read (`_retry_effects`).
            while self._driver.has_notes or self._driver.stale:
                while self._driver.has_notes or self._driver.stale:
                    self._notes_due.clear()  # this flush takes whatever is noted now
                    try:
                        started = await self._driver.flush(then=self._starts_now)
                    except Fenced:
                        raise
                    except Exception as exc:  # noqa: BLE001 - the log is down: keep them, retry
                        # StoreUnavailable: the store's bounded wait ran out, or a read failed
                        # while the database is down. What was noted stays queued and is
                        # tried again until the log takes it: a tool call among the notes
                        # must not be left unlogged, unrun and unanswered for good (seen: a
                        # 9 s PostgreSQL outage left the model waiting for ever when nothing
                        # else came to flush).
                        if self._driver.state.closed or self._driver.fenced:
                            raise
                        logger.error(f"{self}: call {self.call_id}: the log did not take "
                                     f"{self._driver.pending_notes} noted fact(s), retrying "
                                     f"in {delay:.1f}s: {type(exc).__name__}: {exc}")
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, NOTES_RETRY_MAX_S)
                        continue
                    delay = NOTES_RETRY_FIRST_S
                    await self._run_started(started)
                self._effects_failed = False
                await self._perform_due()
                if self._effects_failed:  # the log took the re-read, not the effect: wait
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, NOTES_RETRY_MAX_S)
        except Fenced:
            await self._on_fenced()
        except Exception as exc:  # noqa: BLE001 - a task: report, the next append retries
            logger.exception(f"{self}: could not log {exc}")

    # ------------------------------------------------------------------ effects
    def _starts_now(self, state) -> list[ev.Event]:
        """"Started" for every call due to start now (decided on the state being committed)."""
        return [ev.ToolCallStarted(e.call_id, e.attempt, e.idempotency_key, self._driver.epoch)
                for e in due(state, self._driver.policy, now_us()) if isinstance(e, StartCall)]

    def _sends_now(self, state) -> list[ev.Event]:
        """The intent to send every result due now, if the link can carry it now."""
        if self._session is None or self._disconnecting or self._link_busy():
            return []
        return [ev.ToolResultSending(e.call_id, state.generation, e.via)
                for e in due(state, self._driver.policy, now_us()) if isinstance(e, SendResult)]

    async def _run_started(self, events: list[ev.Event]) -> None:
        """Run the calls whose start was just committed (write-ahead: never before), unless
        Gemini cancelled them meanwhile: a toolCallCancellation read while the start was
        being committed could only be noted (the log was busy with that very commit), and
        is logged after it. The start in the log is then an intent never carried out."""
        calls = [self._driver.state.calls[e.call_id] for e in events
                 if isinstance(e, ev.ToolCallStarted)]
        for call in calls:
            if self._cancelled_for(call.call_id):
                continue
            await self.run_function_calls([FunctionCallFromLLM(
                function_name=call.name, tool_call_id=call.call_id, arguments=call.args,
                context=self._context)])

    async def _run_function_call(self, runner_item):
        # Where pipecat really runs a tool: a call queued behind another (run_in_parallel=
        # False) has no task for a cancellation to stop until its turn comes.
        if self._cancelled_for(runner_item.tool_call_id):
            logger.info(f"{self}: {runner_item.tool_call_id} not run: Gemini cancelled it")
            return
        await super()._run_function_call(runner_item)

    def _cancelled_for(self, call_id: str) -> bool:
        """Did Gemini cancel this call on the wire, or an id that re-asked for it?"""
        calls = self._driver.state.calls
        seen = set()
        while call_id and call_id not in seen:
            if call_id in self._cancelled_on_wire:
                return True
            seen.add(call_id)
            call = calls.get(call_id)
            call_id = call.superseded_by if call is not None else None
        return False

    async def _perform_due(self, only=None) -> None:
        """Do what the log says is due now (or the part `only` selects), until nothing is."""
        async with self._due_lock:
            for _ in range(100):
                effects = [e for e in self._driver.due() if only is None or only(e)]
                try:
                    acted = await self._perform(effects)
                except Fenced:
                    await self._on_fenced()
                    return
                except Exception as exc:  # noqa: BLE001 - the notes task retries
                    self._retry_effects(exc)
                    return
                if not acted:
                    return

    def _retry_effects(self, exc: Exception) -> None:
        """An effect failed (its append: the database is down). The notes task re-reads the
        log and performs what is due again, with backoff, until the log takes it: waiting
        for the next thing the call observes could mean waiting for ever (a deferred call
        whose start was refused, with the bot silent and the model waiting for its result)."""
        logger.error(f"{self}: call {self.call_id}: could not perform what is due, retrying "
                     f"once the log takes it: {type(exc).__name__}: {exc}")
        self._effects_failed = True
        self._ensure_notes_task()

    async def _perform(self, effects: list) -> bool:
        """Perform one round of effects; starts and sends go in one commit each."""
        acted = False
        resolve = [e for e in effects if isinstance(e, ResolveInDoubt)]
        if resolve:
            await self._driver.record(*(ev.ToolCallFailed(e.call_id, OUTCOME_UNKNOWN,
                                                          outcome_unknown=True) for e in resolve))
            acted = True
        starts = {e.call_id for e in effects if isinstance(e, StartCall)}
        if starts:
            # Decided again under the driver's lock, with the record: an observation may
            # have started some of them meanwhile (it does not take the effects lock).
            await self._run_started(await self._driver.record(
                then=lambda state: [e for e in self._starts_now(state) if e.call_id in starts]))
            acted = True
        sends = {e.call_id for e in effects if isinstance(e, SendResult)}
        if sends and not (self._session is None or self._disconnecting or self._link_busy()):
            # Decided again under the driver's lock, as starts are: the record logs what was
            # noted first, and a note may change the answer (the transport still playing
            # the old session's audio when a new one is ready: content then waits for
            # silence). Decided before the notes, a result went in as content mid-speech
            # (tests/service/test_turn_cut_by_reconnect.py).
            sending = await self._driver.record(
                then=lambda state: [e for e in self._sends_now(state) if e.call_id in sends])
            acted |= await self._deliver(sending)
        for effect in effects:
            if isinstance(effect, Reconnect) and not self._link_busy():
                self._schedule_reconnect(effect.reason)
        return acted

    async def _deliver(self, sending: list[ev.Event]) -> bool:
        """Send results whose intent was just committed; confirm those that went out."""
        sent = []
        for intent in sending:
            if intent.generation != self._driver.state.generation or self._session is None:
                # The session it was meant for is gone (a reconnect got in between): never
                # send on another one (a toolResponse for an id it did not issue silences the
                # model). Left unconfirmed, it is resent by the delivery rules, like a send
                # that failed. (pipecat sets `_session` only after the new session's
                # Connected is logged, so a live session always has the current generation.)
                continue
            call = self._driver.state.calls[intent.call_id]
            if await self._send_result(call, intent.via):
                sent.append(ev.ToolResultSent(call.call_id, intent.generation, intent.via))
        # Noted, not committed here: a result's send is confirmed with the next append (or
        # by the notes task), one commit fewer per tool call and none between the send and
        # the next message. Until then `due` sees the send under way on this session and
        # does not repeat it; a reconnect logs the notes first; and a crash before they
        # are logged leaves the send unconfirmed, which the delivery rules resolve (I3)
        # exactly as for a crash right after the send.
        for event in sent:
            self._note(event, lazy=True)
        return bool(sent)

    async def _send_result(self, call, via: str) -> bool:
        try:
            if via == "tool_response":
                response = GeminiLLMAdapter.to_function_response_dict(
                    json.dumps(result_value(call), ensure_ascii=False))
                await self._session.send_tool_response(function_responses=[FunctionResponse(
                    id=call.call_id, name=call.name, response=response)])
            else:
                # Handles are withheld until the model reacts to it (ev.HandleWithheld).
                self._sending_content(self._driver.state.generation)
                await self._session.send_client_content(
                    turns=[Content(role="user", parts=[Part(text=result_as_content(call))])],
                    turn_complete=True)
                if self._is_gemini_3:
                    await self._session.send_realtime_input(text=" ")
        except Exception as exc:  # noqa: BLE001 - unconfirmed: the next session resends it
            logger.warning(f"{self}: sending the result of {call.call_id} failed: {exc}")
            self._after_send_failure(exc)
            return False
        return True

    def _after_send_failure(self, exc: Exception) -> None:
        """A send failed. If the socket is closed, leave the reconnect to the receive loop:
        it still holds what the server sent before closing (a toolCall, a handle, ...) and
        raises on the close only after handing all of it over. Reconnecting from here would
        cancel the loop and silently lose those messages (seen on the wire: a toolCall right
        before a 1011 close vanished, and its handle with it). Any other send failure leaves
        a live socket we cannot trust: replace the session."""
        if isinstance(exc, ConnectionClosed) and self._connection_task is not None \
                and not self._connection_task.done():
            return
        self._schedule_reconnect("send_failed")

    async def _record_quietly(self, *events: ev.Event) -> None:
        """Log facts nothing waits for (an anomaly) without ever raising into the caller (an
        error path: a handshake failure whose anomaly could not be logged used to end the
        connection task, and the call had no session for good)."""
        await self._log_kept(*events)

    async def _record_when_logged(self, *events: ev.Event) -> bool:
        """Log facts the next step must not go without (a session's end before the next
        one starts, a session's start before its messages): while the log is down this
        waits for it, retrying with the notes' backoff (a reconnect during an outage used to
        fail at its first append and leave the call without a session). False: fenced, or
        the call is ending (an outage is not waited out past the end of the call)."""
        delay = NOTES_RETRY_FIRST_S
        while True:
            try:
                await self._driver.record(*events)
                return True
            except Fenced:
                await self._on_fenced()
                return False
            except StoreUnavailable as exc:
                if self._call_ending:
                    logger.error(f"{self}: call {self.call_id}: ending with {events!r} not "
                                 f"logged: {exc}")
                    return False
                logger.error(f"{self}: call {self.call_id}: the log did not take {events!r}, "
                             f"retrying in {delay:.2f}s: {exc}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, NOTES_RETRY_MAX_S)

    async def _on_fenced(self) -> None:
        """A newer worker owns this call: stop talking to Gemini, write nothing more."""
        logger.error(f"{self}: call {self.call_id} was taken over by another worker; stopping")
        if (self._session is not None or self._connection_task is not None) \
                and not self._disconnecting:
            self.create_task(self._disconnect(), "fenced_disconnect")

    # ------------------------------------------------------------------ results
    async def _due_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._perform_due()

    async def _handle_function_call_result(self, frame: FunctionCallResultFrame):
        is_final = frame.properties.is_final if frame.properties else True
        if not is_final:
            return  # one result per call: intermediate results are not part of the protocol here
        call = self._driver.state.calls.get(frame.tool_call_id)
        try:
            if call is None:
                await self._driver.record(ev.AnomalyRecorded(
                    "result_for_unknown_call", {"call_id": frame.tool_call_id,
                                                "name": frame.function_name}))
            elif call.has_outcome:
                await self._driver.record(ev.AnomalyRecorded(
                    "second_result", {"call_id": call.call_id, "name": call.name}))
            else:
                # The result and the intent to send it (if it can go now): one commit.
                outcome = self._outcome_of(call.call_id, frame.result)
                async with self._due_lock:
                    try:
                        sending = await self._driver.record(*outcome, then=self._sends_now)
                    except Fenced:
                        raise
                    except asyncio.CancelledError as exc:
                        # This runs in the call's own task, which the app may cancel
                        # (cancel_function_calls) while the result commits: the tool ran,
                        # and its result must not go down with the task.
                        self._keep_result(call.call_id, outcome, exc)
                        raise
                    except Exception as exc:  # noqa: BLE001 - the log is down: keep the result
                        self._keep_result(call.call_id, outcome, exc)
                        return
                    await self._deliver([e for e in sending
                                         if isinstance(e, ev.ToolResultSending)])
        except Fenced:
            await self._on_fenced()
            return
        await self._perform_due()

    async def push_frame(self, frame, direction: FrameDirection = FrameDirection.DOWNSTREAM):
        # (pipecat broadcasts a cancelled call both ways: the downstream copy is the one.)
        if direction == FrameDirection.DOWNSTREAM and isinstance(frame, FunctionCallCancelFrame):
            await self._handle_function_call_cancelled(frame)
        await super().push_frame(frame, direction)

    async def _handle_interruptions(self, _) -> None:
        # pipecat cancels every running call of a tool registered with
        # cancel_on_interruption (the default) on any interruption, local or Gemini's, and
        # answers none of them: Gemini, which still holds the id unless it cancels it
        # itself, waits for ever. Gemini decides: its toolCallCancellation stops a logged
        # call (see the receive loop); otherwise the call finishes and is answered.
        return None

    async def _handle_function_call_cancelled(self, frame: FunctionCallCancelFrame) -> None:
        """pipecat stopped a running call without a result (its timeout, or the app's
        cancel_function_calls): the model still waits for an answer, so the log records an
        explicit failure, delivered like any result — unless the call was cancelled (by
        Gemini: nothing is owed) or has its outcome already. Decided at commit time, after
        whatever was noted before (a cancellation noted while the log was busy)."""
        call_id = frame.tool_call_id

        def failure(state) -> list[ev.Event]:
            call = state.calls.get(call_id)
            if call is None or call.status != "started" or self._cancelled_for(call_id):
                return []
            return [ev.ToolCallFailed(call_id, STOPPED_ERROR, outcome_unknown=True)]

        if self._cancelled_for(call_id) or not (self._driver.stale
                                                or failure(self._driver.state)):
            # Gemini's own cancellation (nothing owed), or a call that is not running. (A
            # stale state may show what an interrupted commit staged: decide on the log.)
            return

        try:
            await self._driver.record(then=failure)
        except Fenced:
            await self._on_fenced()
            return
        except Exception as exc:  # noqa: BLE001 - the log is down: decided again when it is back
            logger.error(f"{self}: call {self.call_id}: could not log that {call_id} was "
                         f"stopped: {type(exc).__name__}: {exc}")
            self._note(failure)
            return
        await self._perform_due()

    def _outcome_of(self, call_id: str, result: Any) -> list[ev.Event]:
        """The events that log a tool's result. A result the
        log cannot store (NaN, a lone surrogate, a cycle, nesting too deep) is answered as
        the call's failure, with an anomaly holding its start: logged as it was, it failed
        its append and every retry of it, and the model never got an answer (seen)."""
        try:
            value = jsonable(result)
        except (TypeError, ValueError, RecursionError) as exc:  # a cycle, too deep to encode
            problem = f"{type(exc).__name__}: {exc}"[:200]
        else:
            completed = ev.ToolCallCompleted(call_id, value)
            problem = why_unstorable(completed)
            if problem is None:
                return [completed]
        logger.error(f"{self}: call {self.call_id}: the result of {call_id} cannot be stored "
                     f"in the log ({problem}); the call is answered as failed")
        failed = ev.ToolCallFailed(call_id, f"the tool's result cannot be stored in the "
                                            f"call's log ({problem}), so it was not sent")
        return [unstorable_anomaly(ev.ToolCallCompleted.TYPE,
                                   {"call_id": call_id, "result": result}, problem,
                                   self._driver.state.generation), failed]

    def _keep_result(self, call_id: str, outcome: list[ev.Event], exc: BaseException) -> None:
        """The log did not take a tool's result (StoreUnavailable: the database is down; or
        the call's task was cancelled mid-commit). The tool ran and the model waits for its
        answer, so the result must not go down with the exception (seen: it did, and the
        model waited for ever). It is noted instead: the notes task logs it, unless the
        failed append committed after all, and what is due then sends it; never before it
        is logged."""
        logger.error(f"{self}: call {self.call_id}: the result of {call_id} was not logged "
                     f"({type(exc).__name__}: {exc}); it is kept and logged by the notes task")

        def completion(state) -> list[ev.Event]:
            call = state.calls.get(call_id)
            done = call is None or call.has_outcome
            return [] if done else outcome

        self._note(completion)

    async def _tool_result(self, tool_call_id, tool_name, tool_result_message, *, is_final=True,
                           spoken=True):
        # Results leave only through _send_result, by the delivery rules. Upstream would
        # send them from push_frame and again from every context re-scan.
        return None

    async def _process_completed_function_calls(self, send_new_results: bool):
        await super()._process_completed_function_calls(send_new_results=False)
