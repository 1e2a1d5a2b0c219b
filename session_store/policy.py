"""The service's policy: which tools wait for silence, which may run again, when to resume.

Read by both `decide` (observations) and `delivery` (what is due): a module of its own, so
neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .checks import check_count, check_seconds

HANDLE_TTL_US = 2 * 3600 * 1_000_000  # Gemini keeps a resumption handle ~2 h
# A call answered as content this recently may have crossed a re-ask on the wire
# (Policy.crossing_window_s): compaction keeps such calls whatever the window.
CROSSING_WINDOW_US = 10 * 1_000_000


@dataclass(frozen=True)
class Policy:
    """How the service treats tools. Sets name tools; "all"/"none" mean every/no tool."""

    defer: Literal["all", "none"] | frozenset[str] = "all"
    idempotent: frozenset[str] = frozenset()
    #: Answer a re-issued equivalent call (same name and args) from the recorded result.
    reuse_equivalent: Literal["all", "none"] | frozenset[str] = "all"
    #: A repeat of a call answered as content this recently is taken as a re-ask that
    #: crossed the answer on the wire, and answered from the record.
    crossing_window_s: float = 10.0
    #: Reconnect this long before a goAway deadline even if the bot is still speaking.
    go_away_margin_s: float = 5.0
    handle_ttl_us: int = HANDLE_TTL_US
    #: A call whose arguments exceed this (canonical JSON, UTF-8 bytes) is not run: it is
    #: recorded with a bounded stand-in for its arguments and answered with an explicit
    #: error. 1 MiB is google-genai's default websocket frame limit, so no stock client ever
    #: ran anything larger; a 1 MB event appends in ~10-50 ms (bench/huge_args.py).
    max_args_bytes: int = 1 << 20
    #: Defer a NON_BLOCKING call too while the bot speaks. Off by default: the model goes on
    #: talking while such a call runs by design ("let me check that"), so holding the tool
    #: until it stops only delays the answer it is talking its way towards.
    defer_non_blocking: bool = False
    #: Reconnects: "prefer" resumes from the newest handle the delivery rules allow; "avoid"
    #: always starts a fresh session seeded from the log; "auto" avoids resumption where it is
    #: known to lose context (3.1 with a system instruction over ~200 tokens: models.py).
    resumption: Literal["auto", "prefer", "avoid"] = "auto"
    #: Tools with an outcome check (the service's `register_outcome_check` sets these): a
    #: call of theirs left in doubt is asked about by its idempotency key before anything
    #: else is decided (outcomes.py); `rerun_if_not_done`: those a check that says "not done"
    #: may run again.
    outcome_checks: frozenset[str] = frozenset()
    rerun_if_not_done: frozenset[str] = frozenset()
    #: When the connection to Gemini is given up (decide.gives_up), end the call with this
    #: reason in the same commit (`session.closed`), so the call's end is decided on the log
    #: (and replayed) rather than by the app. None: the call stays open for the app to end
    #: (the service still emits `on_connection_given_up`).
    end_call_on_give_up: str | None = None

    def __post_init__(self) -> None:
        # Checked here, once: a typo (defer="lookup_order", a string, not a set of names)
        # otherwise deferred nothing, silently, and idempotent="lookup_order" matched
        # every tool whose name is a substring of it.
        for name in ("defer", "reuse_equivalent", "idempotent", "outcome_checks",
                     "rerun_if_not_done"):
            object.__setattr__(self, name, _tool_names(name, getattr(self, name),
                                                       modes=name in ("defer",
                                                                      "reuse_equivalent")))
        for name in ("crossing_window_s", "go_away_margin_s"):
            check_seconds(f"Policy.{name}", getattr(self, name), zero_ok=True)
        for name in ("handle_ttl_us", "max_args_bytes"):
            check_count(f"Policy.{name}", getattr(self, name))
        if self.resumption not in ("auto", "prefer", "avoid"):
            raise ValueError(f"Policy.resumption must be 'auto', 'prefer' or 'avoid', not "
                             f"{self.resumption!r}")
        if self.end_call_on_give_up is not None and not (
                isinstance(self.end_call_on_give_up, str) and self.end_call_on_give_up):
            raise ValueError(f"Policy.end_call_on_give_up must be a reason (text) or None, "
                             f"not {self.end_call_on_give_up!r:.80}")
        if not isinstance(self.defer_non_blocking, bool):
            raise ValueError(f"Policy.defer_non_blocking must be True or False, not "
                             f"{self.defer_non_blocking!r}")

    def defers(self, name: str, mode: str = "blocking") -> bool:
        if mode == "non_blocking" and not self.defer_non_blocking:
            return False
        return self.defer == "all" or (not isinstance(self.defer, str) and name in self.defer)

    def reuses(self, name: str) -> bool:
        return self.reuse_equivalent == "all" or (
            not isinstance(self.reuse_equivalent, str) and name in self.reuse_equivalent)

    def is_idempotent(self, name: str) -> bool:
        return name in self.idempotent

    def checks(self, name: str) -> bool:
        return name in self.outcome_checks


def _tool_names(field_name: str, value: Any, *, modes: bool) -> Any:
    """"all", "none" (where `modes`) or a frozenset of tool names, from any collection."""
    choices = "'all', 'none' or a set of tool names" if modes else "a set of tool names"
    if isinstance(value, str):
        if modes and value in ("all", "none"):
            return value
        raise ValueError(f"Policy.{field_name} must be {choices}, not the string {value!r} "
                         f"(for one tool: {{{value!r}}})")
    try:
        names = frozenset(value)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise ValueError(f"Policy.{field_name} must be {choices}, not {value!r:.80}")
    return names
