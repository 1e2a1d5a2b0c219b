"""The timeline under construction, as the per-type summaries (`kinds.py`) see it.

`TimelineBuilder` is a draft that also knows how to take an event in and finish; the
summaries only update the draft's views (tool calls, speech, reconnect episodes) and
report problems, so they need nothing of the builder.
"""

from __future__ import annotations

from typing import Any

from ...state import CallState
from ...records import RecordedEvent
from ..fmt import clip
from .entries import Entry, Reconnect, Send, SpeechSegment, Timeline, ToolCallView


class TimelineDraft:
    """A timeline being built, and where it stands: the open speech segment and reconnect
    episode, the generation, the worker, the last event."""

    def __init__(self, call_id: str, t0_us: int | None,
                 prior_calls: dict[str, CallState]) -> None:
        self._tl: Timeline | None = None
        self.call_id, self.t0_us = call_id, t0_us
        self.open_speech: SpeechSegment | None = None
        self.episode: Reconnect | None = None
        self.generation: int | None = None
        self.seen_connect = False
        self.takeover_pending = False
        self.closed_version: int | None = None
        self.worker: str | None = None
        self.last: RecordedEvent | None = None
        self.last_entry: Entry | None = None
        self.prior_calls = prior_calls

    @property
    def tl(self) -> Timeline:
        """The timeline being built: there is one from the first event on (`add`)."""
        if self._tl is None:
            raise RuntimeError("no timeline yet: add an event first")
        return self._tl

    def call(self, call_id: str) -> ToolCallView:
        c = self.tl.tool_calls.get(call_id)
        if c is None:
            c = self.tl.tool_calls[call_id] = ToolCallView(call_id, clipped=True)
            known = self.prior_calls.get(call_id)
            if known is not None:
                _seed(c, known)
        return c

    def inherit(self, original: ToolCallView) -> None:
        """A re-issued id takes its original's outcome as soon as there is one."""
        seen = set()
        while original.superseded_by and original.outcome in ("completed", "failed") \
                and original.tool_call_id not in seen:
            seen.add(original.tool_call_id)
            new = self.call(original.superseded_by)
            if new.outcome is None:
                new.outcome, new.result, new.error = original.outcome, original.result, original.error
                new.outcome_unknown, new.reused_from = original.outcome_unknown, original.tool_call_id
                new.finished_version, new.finished_at_us = (original.finished_version,
                                                            original.finished_at_us)
            original = new

    def end_speech(self, rec: RecordedEvent, source: str) -> None:
        if self.open_speech is not None:
            self.open_speech.end_us, self.open_speech.end_version = rec.recorded_at_us, rec.version
            self.open_speech.end_source = source
            self.open_speech = None

    def ep(self) -> Reconnect:
        if self.episode is None:
            self.episode = Reconnect(from_generation=self.generation)
        return self.episode

    def problem(self, rec: RecordedEvent, kind: str, detail: Any) -> None:
        self.tl.problems.append({"version": rec.version, "at_us": rec.recorded_at_us,
                                 "kind": kind, "detail": detail})


def _seed(view: ToolCallView, c: CallState) -> None:
    """A tool call the window meets after it began: its facts up to the window (never its
    arguments or result: those come redacted, from the final state)."""
    view.name, view.generation = c.name, c.generation
    view.requested_version, view.requested_at_us = c.requested_version, c.requested_at_us
    view.started_at_us = c.started_at_us
    if c.status in ("completed", "failed", "cancelled"):
        view.outcome, view.finished_at_us = c.status, c.finished_at_us
    view.sends = [Send(x.generation, x.via, x.version, None, x.confirmed, None,
                       x.at_us if x.confirmed else None) for x in c.sends]
    first = next((x for x in view.sends if x.confirmed), None)
    if first is not None:
        view.sent_at_us, view.sent_via = first.confirmed_at_us, first.via
        view.sent_generation = first.generation


def bounded(value: Any, limit: int = 2000) -> Any:
    """A value kept in a problem's detail: itself when small, else its preview."""
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, dict):
        return {k: bounded(v, limit) for k, v in list(value.items())[:50]}
    if isinstance(value, list):
        return [bounded(v, limit) for v in value[:50]]
    return value
