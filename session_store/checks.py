"""Checks of numbers a caller passes in (timeouts, sizes, counts): one rule and one wording
for the store's options, the Policy and the service's arguments. A value read wrong is
refused where it is given, saying what to give instead (a negative timeout failed every
append at once; a string where a number was meant failed deep inside)."""

from __future__ import annotations

import math
from typing import Any


def check_seconds(name: str, value: Any, *, none_ok: bool = False,
                  zero_ok: bool = False) -> None:
    """ValueError unless `value` is a finite number of seconds > 0 (or None / 0 if allowed)."""
    if value is None and none_ok:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok)):
        raise ValueError(f"{name} must be a number of seconds {'>=' if zero_ok else '>'} 0"
                         f"{' or None' if none_ok else ''}, not {value!r:.40}")


def check_count(name: str, value: Any, *, none_ok: bool = False, least: int = 1) -> None:
    """ValueError unless `value` is a whole number >= `least` (or None if allowed)."""
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}"
                         f"{' or None' if none_ok else ''}, not {value!r:.40}")
