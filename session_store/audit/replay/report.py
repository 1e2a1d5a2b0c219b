"""A replay's report: where today's code decides otherwise, and how to show it.

`parse_policy` builds the Policy a replay runs with from CLI-style strings; the `*_json`
helpers show events, effects and observations as a divergence carries them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ... import events as ev
from ...decide import Observation
from ...policy import Policy
from ..redaction import Redactor


@dataclass
class Divergence:
    version: int
    to_version: int
    kind: str  # decide | due | resumption
    message: str
    observation: dict[str, Any] | None
    logged: list[dict[str, Any]]
    decided: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def redacted(self, redactor: Redactor) -> "Divergence":
        """A copy fit to show: the observation and the events redacted as the log's events
        are (they carry the same arguments and results), the message scrubbed, and a
        handle it quotes fingerprinted as the events' handles are."""
        items = self.logged + self.decided
        handles = {h for x in items
                   for h in (x.get("resume_from"), x.get("data", {}).get("handle"))
                   if isinstance(h, str) and h}
        message = redactor.scrub_text(self.message)
        for h in handles:
            message = message.replace(repr(h), repr(redactor.fingerprint(h)))
        return dataclasses.replace(
            self, message=message,
            observation=(redactor.redact_observation(self.observation)
                         if self.observation is not None else None),
            logged=[redactor.redact_replay_item(x) for x in self.logged],
            decided=[redactor.redact_replay_item(x) for x in self.decided])


@dataclass
class ReplayReport:
    call_id: str
    events: int = 0
    decisions_checked: int = 0
    effects_checked: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    error: str | None = None  # the log could not be read to the end
    #: Decisions whose observation the log records (`decision.observed`), and of those, how
    #: many of each kind could not be decided again (withheld: the log could not store it).
    decisions_logged: int = 0
    not_replayed: dict[str, int] = field(default_factory=dict)
    #: Decisions of a log written before `decision.observed`, read back from the events
    #: appended together (which covers only some kinds: replayer.py).
    reconstructed: int = 0

    @property
    def coverage(self) -> str:
        """How many of the log's decisions were decided again, in words."""
        parts = []
        if self.decisions_logged or not self.reconstructed:
            replayed = self.decisions_logged - sum(self.not_replayed.values())
            parts.append(f"{replayed} of {self.decisions_logged} decisions replayed")
            if self.not_replayed:
                parts[-1] += " (not replayed: " + ", ".join(
                    f"{n} {kind}" for kind, n in sorted(self.not_replayed.items())) + ")"
        if self.reconstructed:
            parts.append(f"{self.reconstructed} decisions of a log that predates "
                         "decision.observed, reconstructed from its events (sessions opened "
                         "and left, results, stopped calls and outcome checks are not)")
        return "; ".join(parts)

    @property
    def ok(self) -> bool:
        return not self.divergences and self.error is None

    def redacted(self, redactor: Redactor) -> "ReplayReport":
        """A copy fit to show (see Divergence.redacted); the error may quote a stored value."""
        return dataclasses.replace(
            self, divergences=[d.redacted(redactor) for d in self.divergences],
            error=redactor.scrub_text(self.error) if self.error is not None else None)

    def to_json(self) -> dict[str, Any]:
        return {"call": self.call_id, "ok": self.ok, "events": self.events,
                "decisions_checked": self.decisions_checked,
                "effects_checked": self.effects_checked, "error": self.error,
                "coverage": {"decisions_logged": self.decisions_logged,
                             "not_replayed": dict(sorted(self.not_replayed.items())),
                             "reconstructed": self.reconstructed, "text": self.coverage},
                "divergences": [d.to_json() for d in self.divergences]}


def parse_policy(defer: str = "all", idempotent: str = "", reuse: str = "all",
                 go_away_margin_s: float | None = None,
                 end_call_on_give_up: str | None = None) -> Policy:
    """A Policy from CLI-style strings: "all" | "none" | comma-separated tool names."""

    def names(text: str):
        text = (text or "").strip()
        if text in ("all", "none"):
            return text
        return frozenset(n.strip() for n in text.split(",") if n.strip())

    kwargs: dict[str, Any] = {"defer": names(defer), "reuse_equivalent": names(reuse)}
    idem = names(idempotent)
    kwargs["idempotent"] = frozenset() if isinstance(idem, str) else idem
    if go_away_margin_s is not None:
        kwargs["go_away_margin_s"] = go_away_margin_s
    if end_call_on_give_up:
        kwargs["end_call_on_give_up"] = end_call_on_give_up
    return Policy(**kwargs)


def event_json(e: ev.Event) -> dict[str, Any]:
    return {"type": e.TYPE, "data": e.to_data()}


def effect_json(effect: Any) -> dict[str, Any]:
    return {"effect": type(effect).__name__, **dataclasses.asdict(effect)}


def observation_json(obs: Observation) -> dict[str, Any]:
    return {"observation": type(obs).__name__, **dataclasses.asdict(obs)}
