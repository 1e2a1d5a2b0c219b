"""What a window of a call needs to know of the rest of it.

`Evidence` finds, for each confirmed send, the first later sign that the model has it;
`WholeCall` carries the whole call's final state with it; `Prior` says what was going on
just before a window opens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...state import SessionState
from ...records import RecordedEvent


#: Event types that can show a send reached the model, or end the session it went to.
EVIDENCE_TYPES = ("tool.result_sent", "connection.handle_issued", "speech.bot_started",
                  "conversation.message", "tool.call_requested", "connection.disconnected",
                  "connection.connected", "session.worker_attached", "session.closed")


class Evidence:
    """For each send whose write returned, the first later sign that the model has it: a
    resumption handle issued on that session after it (the server's saved state is past
    it), or the model's reaction there (it spoke, wrote, or asked for a tool).

    `sends`: (tool call id, generation, version of the write-ahead intent) of confirmed
    sends. Fed events in version order (a whole call's, or only EVIDENCE_TYPES from the
    first intent on); `done` once every send has its sign or its session has ended."""

    def __init__(self, sends: Iterable[tuple[str, int, int]]):
        # intents not yet confirmed, by (tool call id, generation): their versions
        self.pending: dict[tuple[str, Any], list[int]] = {}
        for cid, gen, version in sorted(sends, key=lambda k: k[2]):
            self.pending.setdefault((cid, gen), []).append(version)
        # confirmed, no sign yet: generation -> {send: version of its confirmation}
        self.open: dict[Any, dict[tuple[str, Any, int], int]] = {}
        self.found: dict[tuple[str, Any, int], dict[str, Any]] = {}

    @property
    def done(self) -> bool:
        return not self.pending and not self.open

    def feed(self, rec: RecordedEvent) -> None:
        if self.done or rec.type not in EVIDENCE_TYPES:
            return
        try:
            d = rec.data
        except Exception:  # noqa: BLE001 - an unreadable row shows nothing
            return
        if not isinstance(d, dict):
            return
        gen = d.get("generation")
        if rec.type == "tool.result_sent":
            call_id = d.get("call_id")
            if not isinstance(call_id, str):
                return
            key = (call_id, gen)
            versions = self.pending.get(key)
            if versions and versions[0] <= rec.version:
                send = (call_id, gen, versions.pop(0))
                if not versions:
                    del self.pending[key]
                self.open.setdefault(gen, {})[send] = rec.version
            return
        if rec.type in ("session.worker_attached", "session.closed"):
            self.open.clear()  # every session of the old worker is over: no sign can come
            return
        waiting = self.open.get(gen)
        if not waiting:
            if rec.type == "connection.connected" and isinstance(gen, int):
                self._end_before(gen)
            return
        kind = {"connection.handle_issued": "handle", "speech.bot_started": "spoke",
                "tool.call_requested": "asked for a tool"}.get(rec.type)
        if rec.type == "conversation.message":
            kind = "wrote" if d.get("role") == "assistant" else None
        if kind is not None:
            for send, confirmed_at in list(waiting.items()):
                if confirmed_at < rec.version:
                    self.found[send] = {"version": rec.version, "kind": kind}
                    del waiting[send]
        elif rec.type == "connection.disconnected":
            waiting.clear()  # that session is over
        if not waiting:
            self.open.pop(gen, None)

    def _end_before(self, gen: int) -> None:
        """A newer session came up: the older ones are over."""
        for g in [g for g in self.open if isinstance(g, int) and g < gen]:
            del self.open[g]


def confirmed_sends(state: SessionState) -> list[tuple[str, int, int]]:
    """(tool call id, generation, intent version) of every confirmed send in a state: what
    `Evidence` looks for."""
    return [(c.call_id, s.generation, s.version) for c in state.calls.values()
            for s in c.sends if s.confirmed]



@dataclass
class WholeCall:
    """The whole call's facts a timeline of part of it states: its final state, the signs
    that sends reached the model (`Evidence`) and which tool calls were ever deferred."""
    state: SessionState
    evidence: Evidence | None = None
    deferred: set[str] | None = None


#: Event types that say why a session is down: `Prior.context` holds those since the last
#: connect before a window.
EPISODE_TYPES = ("connection.disconnected", "connection.reconnect_requested",
                 "connection.go_away", "session.worker_attached")


@dataclass
class Prior:
    """What was going on just before the events listed: the state after version
    `state.version`, that event itself, and `context`: the events of EPISODE_TYPES since
    the last connect (a reconnect under way when the window opens: why, since when)."""
    state: SessionState
    record: RecordedEvent | None = None
    context: list[RecordedEvent] = field(default_factory=list)
