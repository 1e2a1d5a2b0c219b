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
