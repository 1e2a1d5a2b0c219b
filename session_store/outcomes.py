"""Outcome checks: what a call left in doubt is answered once its tool's check has spoken
(pure; the service only asks the check, by the call's idempotency key).

A check answers `Done(result)`, `NotDone()` or `CannotTell(reason)`. The answer is logged
(`tool.outcome_checked`) in the same commit as what follows from it: the real result, an
explicit "not done" (or nothing, and the call runs again, where the tool says that is safe),
or "outcome unknown", which is kept for a check that cannot tell, fails or times out, and
for one whose answer the log cannot take: a `Done` with a result it cannot store (the rule
of an arriving result, answers.arrived_result) or something that is no answer (`NotAnAnswer`,
as the shell saw it). The shell hands the answer over as it came; it is judged here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import events as ev
from .answers import unstorable
from .delivery import OUTCOME_UNKNOWN
from .policy import Policy
from .state import SessionState
from .storable import Unstorable, unstorable_anomaly


@dataclass(frozen=True)
class Done:
    """The operation took effect; `result` is what the model is told it returned."""
    result: Any = None


@dataclass(frozen=True)
class NotDone:
    """The operation did not take effect."""


@dataclass(frozen=True)
class CannotTell:
    """The check cannot say (also: it failed or timed out; `reason` says which)."""
    reason: str = ""


@dataclass(frozen=True)
class NotAnAnswer:
    """A check returned something that is none of the three (`preview`: the start of its
    repr, made by the shell, which alone holds the object)."""
    preview: str = ""


CheckAnswer = Done | NotDone | CannotTell

NOT_DONE_ERROR = ("not done: the system was interrupted while this tool was running, and a "
                  "check confirmed it did not take effect. It was not retried.")


def done_unstorable(call_id: str, answer: Done) -> str | None:
    """Why the log cannot store a `Done`'s result as the call's outcome (None: it can).
    `observed` keeps only this of such an answer: read back, it decides the same."""
    return unstorable(answer.result, lambda: ev.ToolCallCompleted(call_id, answer.result))


def answer_events(state: SessionState, call_id: str, answer: CheckAnswer | NotAnAnswer,
                  policy: Policy) -> list[ev.Event]:
    """The events that log a check's answer about a call in doubt, and the call's outcome
    that follows from it. Nothing for a call no longer in doubt (answered meanwhile)."""
    call = state.calls.get(call_id)
    if call is None or call not in state.in_doubt() or call.checked is not None:
        return []
    match answer:
        case Done():
            problem = done_unstorable(call_id, answer)
            if problem is not None:
                # The operation took effect, but its result cannot be logged, so never sent
                # (an append of it would fail for good): the model is told it cannot tell.
                start = (answer.result.start if isinstance(answer.result, Unstorable)
                         else answer.result)
                return [unstorable_anomaly(ev.ToolCallCompleted.TYPE,
                                           {"call_id": call_id, "result": start}, problem,
                                           state.generation),
                        *_cannot_tell(call_id, f"the check said done, with a result the log "
                                               f"cannot store ({problem})")]
            return [ev.ToolOutcomeChecked(call_id, "done"),
                    ev.ToolCallCompleted(call_id, answer.result)]
        case NotDone():
            out: list[ev.Event] = [ev.ToolOutcomeChecked(call_id, "not_done")]
            if call.name not in policy.rerun_if_not_done:
                out.append(ev.ToolCallFailed(call_id, NOT_DONE_ERROR))
            return out  # (re-run: the checked call is due to start again, delivery.due)
        case CannotTell():
            return _cannot_tell(call_id, answer.reason)
        case NotAnAnswer():
            return _cannot_tell(call_id, f"the check answered {answer.preview}, not Done, "
                                         f"NotDone or CannotTell")
    raise TypeError(f"an outcome check answers Done, NotDone or CannotTell, not {answer!r:.80}")


def _cannot_tell(call_id: str, reason: str) -> list[ev.Event]:
    return [ev.ToolOutcomeChecked(call_id, "cannot_tell", reason[:500]),
            ev.ToolCallFailed(call_id, OUTCOME_UNKNOWN, outcome_unknown=True)]
