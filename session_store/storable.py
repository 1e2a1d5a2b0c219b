"""Values from the wire made storable: what a hostile or buggy server sends (NaN, lone
surrogates, nesting past Python's limits, megabytes of text) must neither bloat the log nor
make an append fail. Pure functions; `decide` uses them for arguments and anomaly details."""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass
from typing import Any

from . import events as ev


@dataclass(frozen=True)
class Unstorable:
    """A tool's value the shell could not even make JSON of (a cycle, nesting too deep):
    `problem` says why, `start` shows its beginning. Read back from the log, it also stands
    for a value that was JSON but not storable (NaN, a lone surrogate), which the log never
    keeps: the decision on it is the same."""
    problem: str
    start: str = ""


def storable_args(args: Any) -> tuple[dict[str, Any], int | None]:
    """The arguments as the log will keep them, and their size in bytes (canonical JSON).
    Size None: they cannot be stored as JSON at all (NaN, a lone surrogate: the SDK lets
    both through); the stand-in then shows their start, escaped."""
    value = args if isinstance(args, dict) else {"_value": _jsonable(args)}
    try:
        return value, len(ev.canonical_json(value).encode())
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return {"_invalid": preview(value)}, None


PREVIEW_CHARS = 200


def is_text(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def clean(text: str) -> str:
    """Text that can be stored: a lone surrogate becomes its escape sequence."""
    return text if is_text(text) else text.encode("utf-8", "backslashreplace").decode()


def preview(value: Any) -> str:
    """The start of a value's JSON, for an anomaly's details (never the whole of a huge one)."""
    try:
        text = ev.canonical_json(value)
    except (TypeError, ValueError):
        try:
            text = repr(value)
        except RecursionError:  # nested past Python's limit: the start of it will do
            text = reprlib.repr(value)
    text = clean(text)
    return text if len(text) <= PREVIEW_CHARS else f"{text[:PREVIEW_CHARS]}… ({len(text)} chars)"


def bounded(detail: Any, depth: int = 0) -> Any:
    """An anomaly's details made storable and small: strings, lists and mappings cut to a few
    hundred chars / items, text that is not valid Unicode escaped, NaN spelled out. What a
    hostile server sends must neither bloat the log nor make an append fail."""
    if isinstance(detail, str):
        detail = clean(detail)
        return detail if len(detail) <= 300 else f"{detail[:300]}… ({len(detail)} chars)"
    if isinstance(detail, float) and not math.isfinite(detail):
        return repr(detail)
    if depth >= 4 and isinstance(detail, (dict, list, tuple)):
        return preview(detail)
    if isinstance(detail, dict):
        items = list(detail.items())
        out = {clean(str(k))[:100]: bounded(v, depth + 1) for k, v in items[:20]}
        if len(items) > 20:
            out["_more_keys"] = len(items) - 20
        return out
    if isinstance(detail, (list, tuple)):
        return [bounded(v, depth + 1) for v in detail[:20]] + (
            [f"… ({len(detail) - 20} more)"] if len(detail) > 20 else [])
    return _jsonable(detail)



def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool, list, dict)):
        return value
    return repr(value)


# --------------------------------------------------------------------------- whole events

def storable_events(events: list[ev.Event], generation: int) -> list[ev.Event]:
    """What a fact from the wire decided, or one anomaly instead if any of it cannot be stored
    (NaN, a lone surrogate in a transcript or handle: the SDK lets both through, the log's
    canonical JSON refuses them). Without this, such a fact would fail its append, be noted
    again, and fail every append after it: one hostile frame would stop the call's log."""
    for e in events:
        problem = why_unstorable(e)
        if problem is not None:
            return [unstorable_anomaly(e.TYPE, e.to_data(), problem, generation)]
    return events


def why_unstorable(e: ev.Event) -> str | None:
    """Why the log cannot store this event (NaN, a lone surrogate, nesting too deep), or None."""
    try:
        ev.canonical_json(e.to_data()).encode()
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        return str(exc)[:200]
    return None


def unstorable_anomaly(event_type: str, data: Any, problem: str,
                       generation: int) -> ev.AnomalyRecorded:
    """The anomaly logged in place of what the log cannot store: its type, the problem and
    the start of the value (masked whole by --redact: it may hold anything)."""
    try:
        text = json.dumps(data, ensure_ascii=True, default=repr)
    except (ValueError, RecursionError):  # a cycle, or nested past Python's own limit
        text = reprlib.repr(data)
    return ev.AnomalyRecorded("unstorable_event", {
        "type": event_type, "error": problem,
        "preview": text[:200] + (f"… ({len(text)} chars)" if len(text) > 200 else "")},
        generation)
