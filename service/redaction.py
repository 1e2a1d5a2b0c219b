"""Secrets never reach the log: settings values are masked by key before they are recorded."""

from __future__ import annotations

import re
from typing import Any

SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|passwd|authorization|credential"
                        r"|private[_-]?key|bearer)", re.IGNORECASE)
MASK = "***"


def redact_settings(values: dict[str, Any]) -> dict[str, Any]:
    """Mask every value whose key looks like a secret, at any depth."""
    return {k: (MASK if SECRET_KEY.search(str(k)) else _redact_value(v)) for k, v in values.items()}


def _redact_value(value: Any) -> Any:
    if isinstance(value, dict):
        return redact_settings(value)
    if isinstance(value, list):
        return [_redact_value(v) for v in value]
    return value
