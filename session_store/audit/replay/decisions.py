"""A log's decisions as it records them: each `decision.observed` with the events decided on
it (what `replay` checks one by one, and what a re-run is compared with)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ... import events as ev
from ...decide import Observation
from ...observed import Unreplayable, observation_of
from ...records import RecordedEvent


@dataclass(frozen=True)
class LoggedDecision:
    """One decision of a log: the record of its observation (`decision.observed`), the
    records of the events decided on it, and the observation rebuilt (None if it cannot
    be: `unreplayable` says why)."""
    observed: RecordedEvent
    events: tuple[RecordedEvent, ...]
    observation: Observation | None
    #: Calls whose arguments the log does not keep: the observation holds stand-ins.
    args_not_logged: frozenset[str] = frozenset()
    unreplayable: str = ""

    @property
    def kind(self) -> str:
        record = self.observed.event
        assert isinstance(record, ev.ObservationRecorded)
        return record.kind


def logged_decisions(records: Sequence[RecordedEvent]) -> Iterator[LoggedDecision]:
    """Each decision the log records, in log order (none for a log written before
    `decision.observed`). ValueError if a decision names more events than the log has."""
    i = 0
    while i < len(records):
        rec = records[i]
        if rec.type != ev.ObservationRecorded.TYPE:
            i += 1
            continue
        record = rec.event
        assert isinstance(record, ev.ObservationRecorded)
        events = tuple(records[i + 1:i + 1 + record.events])
        if len(events) < record.events:
            raise ValueError(f"the decision at version {rec.version} names {record.events} "
                             f"events; the log ends after {len(events)}")
        try:
            obs, not_logged = observation_of(record, [r.event for r in events])
            yield LoggedDecision(rec, events, obs, not_logged)
        except Unreplayable as exc:
            yield LoggedDecision(rec, events, None, unreplayable=str(exc))
        i += 1 + record.events
