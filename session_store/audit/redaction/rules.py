"""What is always secret: key names and credential-like text, masked in every output."""

from __future__ import annotations

import re

MASK = "[REDACTED]"

# pydantic's quote of a refused value in a validation error: up to its `input_type`, or to
# the end of the line when the error was cut short before it.
QUOTED_INPUT = re.compile(r"input_value=.*?(?=, input_type=|$)", re.MULTILINE)

#: Key names containing any of these (normalised: lower case, no `_ - . space`) are always masked.
ALWAYS_SECRET_KEY_PARTS: tuple[str, ...] = (
    "apikey", "token", "secret", "password", "passwd", "passphrase", "authorization",
    "credential", "privatekey", "accesskey", "cookie", "bearer", "signature")

#: Substrings that look like credentials wherever they occur in a string.
ALWAYS_SECRET_PATTERNS: tuple[str, ...] = (
    r"\bsk-[A-Za-z0-9_\-]{6,}",                       # sk-… style API keys
    r"\bAIza[0-9A-Za-z_\-]{20,}",                      # Google API keys
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]{6,}",         # Authorization: Bearer …
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{4,}",  # JWT
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",                   # GitHub tokens
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",                # Slack tokens
    r"\bAKIA[0-9A-Z]{16}\b",                           # AWS access key ids
    # key=value / key: value inside free text (error messages, prompts)
    r"(?i)(?:api[_\-]?key|token|secret|password|passwd|authorization)[\"']?\s*[=:]\s*[\"']?"
    r"[^\s\"',;}]{3,}",
)

#: Where `decide` keeps tool arguments it could not store as they came (too large, not valid
#: JSON): the start of their JSON text, whose keys the key walk cannot see.
ARGS_PREVIEW_KEYS: tuple[str, ...] = ("_preview", "_invalid")


def normalised_key(key: str) -> str:
    return re.sub(r"[\s_\-.]", "", key.lower())
