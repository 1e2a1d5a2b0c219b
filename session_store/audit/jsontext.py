"""JSON text that is safe to print (pure).

`json.dumps(..., ensure_ascii=False)` keeps a string's characters as they are, and a
terminal that shows `--json` or an export renders them: U+202E reverses what follows, U+2066
isolates it, U+009B starts a control sequence. Those (C1 controls, bidi controls and the other
invisible format characters) are written as `\\uXXXX` escapes instead: the same JSON value,
nothing a terminal acts on. Every other character stays readable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

# C1 controls, and the Unicode format characters that move or hide text (bidi embeddings,
# overrides and isolates, marks, zero-width joiners, the BOM, interlinear annotations).
UNSAFE = re.compile("[\u0080-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                    "\ufeff\ufff9-\ufffb]")


def escape_unsafe(text: str) -> str:
    """JSON text with each unsafe character written as an escape (it can only stand inside a
    string there, so the escape means the same)."""
    return UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def dumps(obj: Any, **kwargs: Any) -> str:
    """`json.dumps(obj, ensure_ascii=False, **kwargs)`, safe to print."""
    return escape_unsafe(json.dumps(obj, ensure_ascii=False, **kwargs))


def write_json(write: Callable[[str], Any], obj: Any, *, indent: int | None = None,
               piece: int = 1 << 16) -> None:
    """`write(dumps(obj, indent=indent))`, written in pieces of about `piece` characters
    (and each string whole): the text is never held whole (a state of a 100 MB call was
    held as a 100 MB string, and as the list of pieces it was joined from)."""
    parts: list[str] = []
    size = 0
    for chunk in json.JSONEncoder(ensure_ascii=False, indent=indent).iterencode(obj):
        if size + len(chunk) >= piece:  # (escapes are of one character each)
            write(escape_unsafe("".join(parts)))
            parts, size = [], 0
            if len(chunk) >= piece:  # a long string alone, never copied into a join
                write(escape_unsafe(chunk))
                continue
        parts.append(chunk)
        size += len(chunk)
    write(escape_unsafe("".join(parts)))
