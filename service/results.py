"""Tool results as pipecat hands them over (final, intermediate, or a call stopped without
one): logged with the intent to send them, in one commit, then delivered by the effects.

What a result is (the call's outcome, an anomaly, a failure for a value the log cannot
store) is decided on the log (decide.ResultArrived, ProgressReturned, ToolStopped): this shell
only observes and performs. A result that the log cannot take (the database is down, or the
call's task was cancelled mid-commit) is never dropped: it goes to the log writer, decided
again when logged (`again`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from loguru import logger
from pipecat.frames.frames import FunctionCallResultFrame

from session_store import events as ev
from session_store.decide import ProgressReturned, ResultArrived, ToolStopped
from session_store.delivery import SendResult

from .effects import EffectRunner
from .log_writer import LogWriter
from .port import ServicePort
from .step import Stepper
from .translate import value_of


#: What a result's commit decides at once: the results now due (this one's among them).
SEND_RESULTS = frozenset({SendResult})


class ResultIntake:
    """Takes tool results into the log, for one service (its effects deliver them)."""

    def __init__(self, svc: ServicePort, log: LogWriter, effects: EffectRunner,
                 stepper: Stepper):
        self._svc = svc
        self._driver = svc.driver
        self._log = log
        self._effects = effects
        self._step = stepper.step

    async def result(self, frame: FunctionCallResultFrame) -> None:
        """A tool returned (pipecat's result frame): decided on the log (decide.ResultArrived:
        the call's outcome, or an anomaly for an unknown id or a second result), with the
        intent to send it, in one commit."""
        is_final = frame.properties.is_final if frame.properties else True
        if not is_final:
            await self._intermediate_result(frame)
            return
        arrived = ResultArrived(frame.tool_call_id, frame.function_name,
                                value_of(frame.result), run_llm_of(frame))
        try:
            decision = await self._step(arrived, intend=SEND_RESULTS, hold_effects=True)
        except asyncio.CancelledError as exc:
            # This runs in the call's own task, which the app may cancel
            # (cancel_function_calls) while the result commits: the tool ran, and its
            # result must not go down with the task.
            await self._keep_result(arrived, exc)
            raise
        except Exception as exc:  # noqa: BLE001 - the log is down: keep the result
            await self._keep_result(arrived, exc)
            return
        if decision is None:
            return  # fenced
        if any(isinstance(e, ev.ToolCallFailed) for e in decision.events):
            logger.error(f"{self._svc}: call {self._driver.call_id}: the result of "
                         f"{arrived.call_id} cannot be stored in the log; the call is "
                         "answered as failed")

    async def stopped(self, call_id: str) -> None:
        """pipecat stopped a running call without a result (its timeout, or the app's
        cancel_function_calls): the model still waits for an answer, so the log records an
        explicit failure, delivered like any result, unless Gemini cancelled the call or
        it is not running (decided on the log: answers.stopped_failure)."""
        if self._effects.cancelled(call_id):
            # Gemini's own cancellation, which owes nothing (decide would log nothing): this
            # is pipecat's frame path, and waiting here for the log (down, or busy with the
            # cancellation's own commit) held the bot's audio for as long.
            return
        stop = ToolStopped(call_id, self._effects.cancelled_on_wire)
        try:
            await self._step(stop)
        except Exception as exc:  # noqa: BLE001 - the log is down: decided again when it is back
            logger.error(f"{self._svc}: call {self._driver.call_id}: could not log that "
                         f"{call_id} was stopped: {type(exc).__name__}: {exc}")
            await self._log.log(stop)

    async def _intermediate_result(self, frame: FunctionCallResultFrame) -> None:
        """A tool's intermediate result (`is_final=False`): the NON_BLOCKING call's next part,
        delivered like any result; for any other call it is logged as dropped
        (decide.ProgressReturned)."""
        progress = ProgressReturned(frame.tool_call_id, value_of(frame.result),
                                    "WHEN_IDLE" if run_llm_of(frame) else "SILENT",
                                    frame.function_name)
        try:
            await self._step(progress, intend=SEND_RESULTS, hold_effects=True)
        except Exception as exc:  # noqa: BLE001 - the log is down: kept, logged when it is back
            logger.error(f"{self._svc}: call {self._driver.call_id}: an intermediate result "
                         f"of {progress.call_id} was not logged ({type(exc).__name__}: {exc}); "
                         "it is kept")
            await self._log.log(progress)

    async def _keep_result(self, arrived: ResultArrived, exc: BaseException) -> None:
        """The log did not take a tool's result (StoreUnavailable: the database is down; or
        the call's task was cancelled mid-commit). The tool ran and the model waits for its
        answer, so the result must not go down with the exception (seen: it did, and the
        model waited for ever). It is handed to the log writer instead, decided again when
        logged (`again`: the failed append may have committed after all); what is due then
        sends it, never before it is logged. (Handing it over never suspends, so it is done
        even in a task being cancelled.)"""
        logger.error(f"{self._svc}: call {self._driver.call_id}: the result of "
                     f"{arrived.call_id} was not logged ({type(exc).__name__}: {exc}); it is "
                     "kept and logged by the notes task")
        await self._log.log(dataclasses.replace(arrived, again=True))


def run_llm_of(frame: FunctionCallResultFrame) -> bool:
    """Does the result ask the model to answer it (pipecat's rule; for a NON_BLOCKING call
    WHEN_IDLE rather than SILENT)?"""
    run_llm = frame.properties.run_llm if frame.properties else None
    if run_llm is None:
        run_llm = frame.run_llm if frame.run_llm is not None else True
    return bool(run_llm)
