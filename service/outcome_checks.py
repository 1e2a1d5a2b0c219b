"""Tools at the edges of a call: outcome checks asked on takeover, and the grace a tool still
running at the hang-up gets to log its outcome.

A tool that is not idempotent may declare a check (`register_outcome_check`): given the
idempotency key of a call a crash left in doubt (and its arguments), it asks the system the
tool acts on whether the operation took effect. What the answer means for the call is decided
in the core (session_store.outcomes); this module only asks, bounded by the check's timeout,
and hands the answer to the log as it came (a result as JSON, or `Unstorable`; something that
is no answer as `NotAnAnswer`). A check that raises or times out counts as "cannot tell";
one that answers what the log cannot take is judged so by the core.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from loguru import logger

from session_store.checks import check_seconds
from session_store.decide import OutcomeAnswered
from session_store.delivery import CheckOutcome
from session_store.outcomes import CannotTell, CheckAnswer, Done, NotAnAnswer, NotDone
from session_store.storable import clean

from .driver import CallDriver
from .log_writer import LogWriter
from .step import Drain, Stepper
from .translate import value_of

#: check(idempotency_key, args) -> Done(result) | NotDone() | CannotTell(reason), or an
#: awaitable of one.
OutcomeCheck = Callable[[str, dict[str, Any]], "CheckAnswer | Awaitable[CheckAnswer]"]

#: How long a check may take by default: the takeover waits for it before the new session
#: is seeded (the caller hears nothing meanwhile).
CHECK_TIMEOUT_S = 5.0
#: How long a tool still running at the hang-up may go on to log its outcome.
TOOL_GRACE_S = 10.0


@dataclasses.dataclass(frozen=True)
class _Check:
    check: OutcomeCheck
    timeout_s: float


class OutcomeChecks:
    """The outcome checks of one service's tools, and asking them."""

    def __init__(self, driver: CallDriver, log: LogWriter, stepper: Stepper):
        self._driver = driver
        self._log = log
        self._step = stepper.step
        self._checks: dict[str, _Check] = {}

    def register(self, name: str, check: OutcomeCheck, *, rerun_if_not_done: bool = False,
                 timeout_s: float = CHECK_TIMEOUT_S) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"an outcome check needs the tool's name, not {name!r:.80}")
        if not callable(check):
            raise TypeError(f"the outcome check of {name!r} must be callable, not "
                            f"{type(check).__name__}")
        if not isinstance(rerun_if_not_done, bool):
            raise ValueError(f"rerun_if_not_done must be True or False, not "
                             f"{rerun_if_not_done!r}")
        check_seconds("timeout_s", timeout_s)
        self._checks[name] = _Check(check, timeout_s)
        policy = self._driver.policy
        rerun = policy.rerun_if_not_done - {name} | ({name} if rerun_if_not_done else set())
        self._driver.policy = dataclasses.replace(
            policy, outcome_checks=policy.outcome_checks | {name}, rerun_if_not_done=rerun)

    async def settle(self) -> None:
        """Ask the check of every call in doubt that has one (at once), and log each answer
        with what follows from it. An answer the log cannot take now is kept by the log
        writer and decided when it is logged."""
        due = [e for e in self._driver.due() if isinstance(e, CheckOutcome)]
        if not due:
            return
        answers = await asyncio.gather(*(self._ask(e) for e in due))
        for effect, answer in zip(due, answers):
            observed = OutcomeAnswered(effect.call_id, answer)
            try:
                # (What follows from the answers is done by the caller, once they are in.)
                if await self._step(observed, drain=Drain.NO) is None:
                    return  # a newer worker has the call
            except Exception as exc:  # noqa: BLE001 - the log is down: kept, logged later
                logger.error(f"call {self._driver.call_id}: the outcome check's answer for "
                             f"{effect.call_id} was not logged ({type(exc).__name__}: {exc}); "
                             "it is kept")
                await self._log.log(observed)

    async def _ask(self, effect: CheckOutcome) -> CheckAnswer | NotAnAnswer:
        call = self._driver.state.calls[effect.call_id]
        entry = self._checks.get(call.name)
        if entry is None:  # (the policy names only registered tools)
            return CannotTell("no outcome check is registered for this tool")
        try:
            answer = entry.check(effect.idempotency_key, dict(call.args))
            if inspect.isawaitable(answer):
                answer = await asyncio.wait_for(answer, entry.timeout_s)
        except asyncio.TimeoutError:
            answer = CannotTell(f"the check did not answer within {entry.timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - a failing check cannot tell
            answer = CannotTell(f"the check failed: {type(exc).__name__}: {exc}"[:300])
        observed = _as_observed(answer)
        logger.info(f"call {self._driver.call_id}: {call.name} {effect.call_id} was in doubt; "
                    f"its outcome check says {type(observed).__name__}")
        return observed


def _as_observed(answer: Any) -> CheckAnswer | NotAnAnswer:
    """The answer as an observation carries it: a result as JSON (or `Unstorable`, where it
    cannot be made JSON), anything that is no answer as the start of its repr. Whether the
    log can take it is decided on the log (outcomes.answer_events)."""
    if isinstance(answer, Done):
        return Done(value_of(answer.result))
    if isinstance(answer, (NotDone, CannotTell)):
        return answer
    try:
        text = repr(answer)
    except Exception:  # noqa: BLE001 - a repr that fails still says what came back
        text = f"<{type(answer).__name__}>"
    return NotAnAnswer(clean(f"{text:.80}"))


async def wait_for_tools(tasks: Collection[asyncio.Task | None], grace_s: float, label: str) -> None:
    """At the hang-up: let tools still running finish (their outcome is logged after the
    end) for up to `grace_s`; what is still running then is left to pipecat's cleanup, and
    the call's state shows it in doubt."""
    running = {t for t in tasks if t is not None and not t.done()}
    if not running or grace_s <= 0:
        return
    logger.info(f"{label}: the call ended with {len(running)} tool call(s) running; waiting "
                f"up to {grace_s:g} s for their outcome")
    _done, pending = await asyncio.wait(running, timeout=grace_s)
    if pending:
        logger.warning(f"{label}: {len(pending)} tool call(s) still running {grace_s:g} s "
                       "after the end of the call; their outcome stays in doubt")
