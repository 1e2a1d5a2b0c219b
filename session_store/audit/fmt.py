"""Formatting of times and values for the tools' output (pure).

Three rules every human-readable output follows:

* `clip`: a value is previewed from its start, never serialised whole first, so rendering an
  event costs the same whether its transcript holds ten characters or ten million.
* `words`: values read as words (`lookup_order, send_email`, `yes`, `–`), never as Python
  reprs (`['lookup_order']`, `False`, `None`).
* `printable`: control characters from stored data are shown escaped (`\\x1b`), so a stored
  escape sequence cannot clear or rewrite the reader's terminal.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: What a one-line summary shows of a value (characters).
PREVIEW = 100
#: What a preview of a record keeps of each string (`preview_record`, characters).
PREVIEW_LIMIT = 2000


def iso(at_us: int | None) -> str | None:
    """Exact ISO 8601 (UTC, microseconds) of a time in microseconds since the epoch."""
    if at_us is None:
        return None
    return (EPOCH + timedelta(microseconds=at_us)).isoformat()


def stamp(at_us: int) -> str:
    """A fixed-width UTC time for a line of output: 2026-01-01T00:00:04.300000Z."""
    return (EPOCH + timedelta(microseconds=at_us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ms(a_us: int | None, b_us: int | None) -> float | None:
    """Milliseconds from a to b (None when either is unknown)."""
    if a_us is None or b_us is None:
        return None
    return round((b_us - a_us) / 1000, 3)


# ------------------------------------------------------------------------- clip

class _Full(Exception):
    pass


class _Preview:
    """Compact JSON text of a value, written until `limit` characters are out."""

    def __init__(self, limit: int):
        self.limit, self.size = limit, 0
        self.parts: list[str] = []

    def put(self, text: str) -> None:
        room = self.limit - self.size
        if len(text) > room:
            self.parts.append(text[:room])
            self.size = self.limit
            raise _Full
        self.parts.append(text)
        self.size += len(text)

    def string(self, text: str) -> None:
        # Only the part that can show is escaped: json.dumps of a 10 MB string is not free.
        room = self.limit - self.size
        head = text[:room + 1]
        self.put(json.dumps(head, ensure_ascii=False)[:-1] if len(text) > room
                 else json.dumps(head, ensure_ascii=False))

    def value(self, v: Any, depth: int = 0) -> None:
        if isinstance(v, str):
            self.string(v)
        elif isinstance(v, dict):
            if depth > 20:
                self.put("{…}")
                return
            self.put("{")
            for i, (k, x) in enumerate(sorted(v.items(), key=lambda kv: str(kv[0]))
                                       if len(v) <= 200 else v.items()):
                if i:
                    self.put(", ")
                self.string(str(k))
                self.put(": ")
                self.value(x, depth + 1)
            self.put("}")
        elif isinstance(v, (list, tuple)):
            if depth > 20:
                self.put("[…]")
                return
            self.put("[")
            for i, x in enumerate(v):
                if i:
                    self.put(", ")
                self.value(x, depth + 1)
            self.put("]")
        elif v is None or isinstance(v, (bool, int, float)):
            self.put(json.dumps(v))
        else:
            self.string(str(v))


def clip(value: Any, limit: int = PREVIEW) -> str:
    """A preview of at most `limit` characters: a string as it is, anything else as compact
    JSON (keys sorted); "…" marks a cut. The work is bounded by `limit`, not by the value."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit - 1] + "…"
    out = _Preview(limit)
    try:
        out.value(value)
    except _Full:
        return "".join(out.parts)[:limit - 1] + "…"
    except RecursionError:
        return "".join(out.parts)[:limit - 1] + "…"
    return "".join(out.parts)


#: How `clip_strings` ends a string it cut: the characters left out.
_CUT = re.compile(r"… \(([0-9,]+) more characters\)\Z")


def stored_length(text: str) -> int:
    """The length of the string `text` is a preview of (`clip_strings`); its own length if
    it is none."""
    cut = _CUT.search(text)
    return len(text) if cut is None else cut.start() + int(cut[1].replace(",", ""))


#: How far back a preview may end before its limit to end between words (see `_preview_end`).
_WORD_BACKOFF = 1000


def _preview_end(text: str, limit: int) -> int:
    """Where a preview of `text` cut at `limit` ends: before the word the cut goes through,
    and, when the text goes on with a word holding digits, before the words with digits
    just before it. Redaction reads previews: the start of a key or of a phone number
    matches no pattern, so a preview must not end inside one ("… +49 30 |1234…"). At
    `limit` if that would drop more than `_WORD_BACKOFF` characters (a long blob)."""
    def word_start(at: int) -> int:
        while at > 0 and not text[at - 1].isspace():
            at -= 1
        return at

    end = limit if text[limit - 1].isspace() or text[limit].isspace() else word_start(limit)
    after = end
    while after < len(text) and text[after].isspace():
        after += 1
    nxt = after
    while nxt < len(text) and not text[nxt].isspace() and nxt - after < _WORD_BACKOFF:
        nxt += 1
    if any(c.isdigit() for c in text[after:nxt]):  # a number goes on past the end
        while True:
            gap = end
            while gap > 0 and text[gap - 1].isspace():
                gap -= 1
            start = word_start(gap)
            if start == gap or not any(c.isdigit() for c in text[start:gap]):
                break
            end = start
            if limit - end > _WORD_BACKOFF:
                break
    return limit if limit - end > _WORD_BACKOFF else end


def clip_strings(value: Any, limit: int = 2000) -> Any:
    """The same JSON value with every string longer than `limit` cut to its preview (a
    viewer that shows a state must not ship ten megabytes of one transcript). A preview cut
    again keeps the count of the characters its stored value leaves out (a fold of previews
    shown at a shorter limit), and one already that short stays as it is."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        cut = _CUT.search(value)
        if cut is not None and cut.start() <= limit:
            return value
        end = _preview_end(value, limit)
        return value[:end] + f"… ({stored_length(value) - end:,} more characters)"
    if isinstance(value, dict):
        return {k: clip_strings(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [clip_strings(v, limit) for v in value]
    return value


def preview_record(rec, limit: int = PREVIEW_LIMIT):
    """The record with every string value longer than `limit` cut (a RecordedEvent, for a
    view that shows previews: one parse of the payload, then redaction and formatting work
    on what can be shown, not on ten megabytes). Unchanged when short or not JSON."""
    import dataclasses

    from ..events import canonical_json

    if len(rec.data_json) <= 4 * limit:
        return rec
    try:
        data = json.loads(rec.data_json)
    except (ValueError, RecursionError):
        return rec
    return dataclasses.replace(rec, data_json=canonical_json(clip_strings(data, limit)))


# ------------------------------------------------------------------------- words

def words(value: Any, limit: int = PREVIEW) -> str:
    """A value as a person reads it: a list as `a, b`, a boolean as yes/no, nothing as –."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        if not value:
            return "none"
        if all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in value[:50]):
            return clip(", ".join(str(x) for x in value[:50])
                        + (", …" if len(value) > 50 else ""), limit)
        return clip(list(value), limit)
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, (int, float)):
        return str(value)
    return clip(value, limit)


# ------------------------------------------------------------------------- printable

def _escape_table() -> dict[int, str]:
    table = {c: f"\\x{c:02x}" for c in range(0x20)}
    table.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x7F: "\\x7f"})
    table.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})  # C1: CSI, OSC, …
    # Characters that reorder or hide text (a bidi override turns "exe.txt" into "txt.exe")
    # and line breaks a terminal honours.
    for c in (0x061C, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x202A,
              0x202B, 0x202C, 0x202D, 0x202E, 0x2060, 0x2066, 0x2067, 0x2068, 0x2069,
              0xFEFF):
        table[c] = f"\\u{c:04x}"
    return table


_ESCAPES = _escape_table()


def printable(text: Any) -> str:
    """Text safe to print on a terminal: control, bidi and invisible characters shown as
    escapes (`\\x1b[2J` prints as those six characters; nothing is executed)."""
    return str(text).translate(_ESCAPES)
