"""Tool results as pipecat hands them over (final, intermediate, or a call stopped without
one): logged with the intent to send them, in one commit, then delivered by the effects.

A result that the log cannot take (the database is down, or the call's task was cancelled
mid-commit) is never dropped: it goes to the log writer, decided again when logged
(decide.unless_answered). A result the log cannot store is answered as the call's failure.
"""

from __future__ import annotations

import asyncio
from typing import Any

from loguru import logger
from pipecat.frames.frames import FunctionCallResultFrame

from session_store import events as ev
from session_store.answers import stopped_failure
from session_store.decide import ProgressReturned, ResultReturned, ToolStopped
from session_store.delivery import SendResult
from session_store.errors import Fenced
from session_store.storable import unstorable_anomaly, why_unstorable

from .effects import EffectRunner
from .log_writer import LogWriter
from .port import ServicePort
from .translate import jsonable


#: What a result's commit decides at once: the results now due (this one's among them).
SEND_RESULTS = frozenset({SendResult})


class ResultIntake:
    """Takes tool results into the log, for one service (its effects deliver them)."""

    def __init__(self, svc: ServicePort, log: LogWriter, effects: EffectRunner):
        self._svc = svc
        self._driver = svc.driver
        self._log = log
        self._effects = effects

    async def result(self, frame: FunctionCallResultFrame) -> None:
        """A tool returned (pipecat's result frame): logged with the intent to send it."""
        is_final = frame.properties.is_final if frame.properties else True
        call = self._driver.state.calls.get(frame.tool_call_id)
        if not is_final:
            await self._intermediate_result(frame, call)
            return
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
                outcome = self._outcome_of(call, frame.result, scheduling_of(frame, call))
                async with self._effects.due_lock:
                    try:
                        decision = await self._driver.record(*outcome, intend=SEND_RESULTS)
                    except Fenced:
                        raise
                    except asyncio.CancelledError as exc:
                        # This runs in the call's own task, which the app may cancel
                        # (cancel_function_calls) while the result commits: the tool ran,
                        # and its result must not go down with the task.
                        await self._keep_result(call.call_id, outcome, exc)
                        raise
                    except Exception as exc:  # noqa: BLE001 - the log is down: keep the result
                        await self._keep_result(call.call_id, outcome, exc)
                        return
                    await self._effects.deliver(decision.intents)
        except Fenced:
            await self._svc.on_fenced()
            return
        await self._effects.perform_due()

    async def stopped(self, call_id: str) -> None:
        """pipecat stopped a running call without a result (its timeout, or the app's
        cancel_function_calls): the model still waits for an answer, so the log records an
        explicit failure, delivered like any result (decide.stopped_failure)."""
        stop = ToolStopped(call_id, self._effects.cancelled_on_wire)
        if self._effects.cancelled(call_id) or not (
                self._driver.stale or stopped_failure(self._driver.state, call_id, stop.wire_ids)):
            # Gemini's own cancellation (nothing owed), or a call that is not running. (A
            # stale state may show what an interrupted commit staged: decide on the log.)
            return
        try:
            await self._driver.observe(stop)
        except Fenced:
            await self._svc.on_fenced()
            return
        except Exception as exc:  # noqa: BLE001 - the log is down: decided again when it is back
            logger.error(f"{self._svc}: call {self._driver.call_id}: could not log that "
                         f"{call_id} was stopped: {type(exc).__name__}: {exc}")
            await self._log.log(stop)
            return
        await self._effects.perform_due()

    async def _intermediate_result(self, frame: FunctionCallResultFrame, call) -> None:
        """A tool's intermediate result (`is_final=False`): logged as the call's next part and
        delivered like any result, where the call is NON_BLOCKING. A blocking call takes one
        result (the model waits for it): the intermediate one is logged as dropped, never
        dropped silently."""
        if call is None or call.mode != "non_blocking" or call.has_outcome:
            why = ("no such call" if call is None else "the call already has its outcome"
                   if call.has_outcome else "the call is blocking: the model takes one result")
            await self._log.log(ev.AnomalyRecorded("intermediate_result_dropped", {
                "call_id": frame.tool_call_id, "name": frame.function_name, "why": why},
                self._driver.state.generation))
            return
        call_id, scheduling = call.call_id, scheduling_of(frame, call)
        try:
            value = jsonable(frame.result)
            problem = why_unstorable(ev.ToolCallProgress(call_id, 1, value))
        except (TypeError, ValueError, RecursionError) as exc:
            problem = f"{type(exc).__name__}: {exc}"[:200]
        if problem is not None:
            await self._log.log(unstorable_anomaly(ev.ToolCallProgress.TYPE, {
                "call_id": call_id, "result": frame.result}, problem,
                self._driver.state.generation))
            return
        progress = ProgressReturned(call_id, value, scheduling)
        try:
            async with self._effects.due_lock:
                decision = await self._driver.observe(progress, intend=SEND_RESULTS)
                await self._effects.deliver(decision.intents)
        except Fenced:
            await self._svc.on_fenced()
            return
        except Exception as exc:  # noqa: BLE001 - the log is down: kept, logged when it is back
            logger.error(f"{self._svc}: call {self._driver.call_id}: an intermediate result "
                         f"of {call_id} was not logged ({type(exc).__name__}: {exc}); it is "
                         "kept")
            await self._log.log(progress)
            return
        await self._effects.perform_due()

    def _outcome_of(self, call, result: Any, scheduling: str | None = None) -> list[ev.Event]:
        """The events that log a tool's result. A result the log cannot store (NaN, a lone
        surrogate, a cycle, nesting too deep) is answered as the call's failure, with an
        anomaly holding its start: logged as it was, it failed its append and every retry
        of it, and the model never got an answer (seen)."""
        call_id = call.call_id
        problem: str | None
        try:
            value = jsonable(result)
        except (TypeError, ValueError, RecursionError) as exc:  # a cycle, too deep to encode
            problem = f"{type(exc).__name__}: {exc}"[:200]
        else:
            completed = ev.ToolCallCompleted(call_id, value, scheduling=scheduling)
            problem = why_unstorable(completed)
            if problem is None:
                return [completed]
        logger.error(f"{self._svc}: call {self._driver.call_id}: the result of {call_id} "
                     f"cannot be stored in the log ({problem}); the call is answered as failed")
        failed = ev.ToolCallFailed(call_id, f"the tool's result cannot be stored in the "
                                            f"call's log ({problem}), so it was not sent")
        return [unstorable_anomaly(ev.ToolCallCompleted.TYPE,
                                   {"call_id": call_id, "result": result}, problem,
                                   self._driver.state.generation), failed]

    async def _keep_result(self, call_id: str, outcome: list[ev.Event],
                           exc: BaseException) -> None:
        """The log did not take a tool's result (StoreUnavailable: the database is down; or
        the call's task was cancelled mid-commit). The tool ran and the model waits for its
        answer, so the result must not go down with the exception (seen: it did, and the
        model waited for ever). It is handed to the log writer instead, decided when logged
        (decide.unless_answered: the failed append may have committed after all); what is
        due then sends it, never before it is logged. (Handing it over never suspends, so
        it is done even in a task being cancelled.)"""
        logger.error(f"{self._svc}: call {self._driver.call_id}: the result of {call_id} was "
                     f"not logged ({type(exc).__name__}: {exc}); it is kept and logged by the "
                     "notes task")
        await self._log.log(ResultReturned(call_id, tuple(outcome)))


def scheduling_of(frame: FunctionCallResultFrame, call) -> str | None:
    """How a NON_BLOCKING call's result is taken (pipecat's rule: WHEN_IDLE when the model
    should answer it, SILENT when it should only take it in); None for a blocking call."""
    if call is None or call.mode != "non_blocking":
        return None
    run_llm = frame.properties.run_llm if frame.properties else None
    if run_llm is None:
        run_llm = frame.run_llm if frame.run_llm is not None else True
    return "WHEN_IDLE" if run_llm else "SILENT"
