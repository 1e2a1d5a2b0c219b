"""Hand-built events and streams for tests without a database (no fixtures here)."""

from __future__ import annotations

from collections.abc import Sequence

from session_store import events as ev
from session_store.events import Event, canonical_json
from session_store.records import GENESIS_HASH, RecordedEvent, chain_hash

T0_US = 1_750_000_000_000_000  # a fixed "now" for hand-built streams


def opened(worker: str = "w1", epoch: int = 1) -> ev.SessionOpened:
    return ev.SessionOpened(model="gemini-live", tools=["lookup", "book"], worker=worker,
                            epoch=epoch)


def msg(i: int, role: str = "user") -> ev.ConversationMessage:
    return ev.ConversationMessage(role=role, text=f"turn {i}")


def record(stream_id: str, events: Sequence[Event], *, start_version: int = 1,
           start_position: int | None = None, t0_us: int = T0_US, step_us: int = 1000,
           prev_hash: str = GENESIS_HASH,
           recorded_at_us: Sequence[int] | None = None) -> list[RecordedEvent]:
    """Hand-built RecordedEvents with versions start_version.. and a valid hash chain."""
    out, h = [], prev_hash
    for i, e in enumerate(events):
        version = start_version + i
        at = recorded_at_us[i] if recorded_at_us is not None else t0_us + step_us * (version - 1)
        data_json = canonical_json(e.to_data())
        h = chain_hash(h, stream_id, version, e.TYPE, e.SCHEMA, at, data_json)
        position = (start_position if start_position is not None else 1000) + i
        out.append(RecordedEvent(stream_id, version, position, e.TYPE, e.SCHEMA, data_json, at, h))
    return out


def raw_record(stream_id: str, version: int, etype: str, schema_version: int, data_json: str,
               *, prev_hash: str = GENESIS_HASH, at_us: int = T0_US,
               position: int = 1) -> RecordedEvent:
    """A RecordedEvent with arbitrary stored parts (type, schema, JSON) and a valid hash."""
    h = chain_hash(prev_hash, stream_id, version, etype, schema_version, at_us, data_json)
    return RecordedEvent(stream_id, version, position, etype, schema_version, data_json, at_us, h)


class Log:
    """A hand-built stream: add events (each gets the next version and a time), fold it."""

    def __init__(self, stream_id: str = "call-1", t0_us: int = T0_US, step_us: int = 1000):
        self.stream_id, self.step_us, self._next_at = stream_id, step_us, t0_us
        self.events: list[Event] = []
        self.times: list[int] = []

    @property
    def version(self) -> int:
        return len(self.events)

    @property
    def now_us(self) -> int:
        """The time of the last event."""
        return self.times[-1] if self.times else self._next_at

    def add(self, *events: Event, at_us: int | None = None) -> int:
        """Append events (at `at_us`, else one step after the previous); returns the version."""
        if at_us is not None:
            self._next_at = at_us
        for e in events:
            self.events.append(e)
            self.times.append(self._next_at)
            self._next_at += self.step_us
        return self.version

    def records(self, start: int = 1) -> list[RecordedEvent]:
        recs = record(self.stream_id, self.events, recorded_at_us=self.times)
        return recs[start - 1:]

    def state(self):
        from session_store.projection import fold
        return fold(self.records())

    def observe(self, obs, policy=None, *, at_us: int | None = None,
                decided: list[Event] | None = None) -> list[Event]:
        """`obs` logged as the driver logs it (the observation, then what `decide` made of
        it, at `at_us`), or with `decided` in place of decide's own events (a shell that did
        otherwise); nothing if it decided nothing. Returns the events decided."""
        from session_store.decide import decide
        from session_store.observed import observation_record
        from session_store.policy import Policy

        at = self._next_at if at_us is None else at_us
        state = self.state()
        events = decide(state, obs, policy or Policy(), at) if decided is None else decided
        if events:
            self.add(observation_record(obs, events, state), *events, at_us=at)
        return events
