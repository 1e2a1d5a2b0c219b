"""Formatting of times and values for the tools' output (pure)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def iso(at_us: int | None) -> str | None:
    """Exact ISO 8601 (UTC, microseconds) of a time in microseconds since the epoch."""
    if at_us is None:
        return None
    return (EPOCH + timedelta(microseconds=at_us)).isoformat()


def ms(a_us: int | None, b_us: int | None) -> float | None:
    """Milliseconds from a to b (None when either is unknown)."""
    if a_us is None or b_us is None:
        return None
    return round((b_us - a_us) / 1000, 3)


def short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True,
                                                           ensure_ascii=False)
    return text if len(text) <= limit else text[:limit - 1] + "…"
