"""What full redaction covers: the configuration (defaults, environment, a JSON or TOML file)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from ..pii import KINDS as PII_KINDS

#: Argument/result keys masked by default when full redaction is on (personal data).
DEFAULT_REDACT_KEYS: tuple[str, ...] = (
    "email", "phone", "phone_number", "mobile", "address", "street", "postcode", "zip",
    "card_number", "card", "cvv", "iban", "account_number", "ssn", "date_of_birth", "dob",
    "pin", "otp")

ENV_CONFIG = "SESSION_STORE_REDACT_CONFIG"
ENV_KEYS = "SESSION_STORE_REDACT_KEYS"


@dataclass(frozen=True)
class RedactionConfig:
    """What to mask. `enabled` turns on full redaction (the always-level is never off)."""

    enabled: bool = False
    #: Key names (fnmatch patterns, case-insensitive, `_ - .` and spaces optional: `phone_number`
    #: is also `phoneNumber`) masked at any depth when enabled.
    keys: tuple[str, ...] = DEFAULT_REDACT_KEYS
    transcripts: bool = True
    settings_values: bool = True
    tool_args: str = "keys"  # "keys": only configured keys | "all": every leaf
    tool_results: str = "keys"
    handles: bool = True
    #: Extra key-name parts and regexes added to the always-level.
    secret_keys: tuple[str, ...] = ()
    secret_patterns: tuple[str, ...] = ()
    #: Personal data found inside the free text that full redaction keeps (`pii.py`).
    free_text_pii: bool = True
    pii_kinds: tuple[str, ...] = PII_KINDS
    #: Where a phone number without its country code is read as a local one.
    phone_regions: tuple[str, ...] = ("US", "GB")

    def with_enabled(self, enabled: bool = True) -> "RedactionConfig":
        return dataclasses.replace(self, enabled=enabled)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_config(*, redact: bool = False, keys: str | None = None, path: str | None = None,
                env: Mapping[str, str] | None = None) -> RedactionConfig:
    """Combine a config file (--redact-config or $SESSION_STORE_REDACT_CONFIG, JSON or TOML),
    $SESSION_STORE_REDACT_KEYS and --redact-keys. Giving keys implies full redaction; a file
    with `enabled = true` forces it for every output."""
    if env is None:
        env = os.environ
    cfg = RedactionConfig()
    path = path or env.get(ENV_CONFIG) or None
    if path:
        cfg = _from_file(Path(path))
    extra: list[str] = []
    for source in (env.get(ENV_KEYS), keys):
        if source:
            extra += [k.strip() for k in source.split(",") if k.strip()]
    if extra:
        cfg = dataclasses.replace(cfg, keys=tuple(dict.fromkeys(cfg.keys + tuple(extra))),
                                  enabled=True)
    if redact:
        cfg = cfg.with_enabled()
    return cfg


def _from_file(path: Path) -> RedactionConfig:
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a redaction config is a JSON/TOML object")
    data = dict(data.get("redaction", data))
    replace_defaults = data.pop("replace_default_keys", False)
    if not isinstance(replace_defaults, bool):
        raise ValueError(f"{path}: replace_default_keys must be true or false")
    allowed = {f.name for f in dataclasses.fields(RedactionConfig)}
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{path}: unknown redaction setting(s) {sorted(unknown)}; "
                         f"known: {sorted(allowed)}")
    for mode in ("tool_args", "tool_results"):
        if data.get(mode, "keys") not in ("keys", "all"):
            raise ValueError(f"{path}: {mode} must be 'keys' or 'all'")
    # Checked, not coerced: `enabled = "no"` is truthy and `keys = "email"` is five keys.
    for name in ("enabled", "transcripts", "settings_values", "handles", "free_text_pii"):
        if name in data and not isinstance(data[name], bool):
            raise ValueError(f"{path}: {name} must be true or false, not {data[name]!r}")
    for name in ("keys", "secret_keys", "secret_patterns", "pii_kinds", "phone_regions"):
        if name in data and not (isinstance(data[name], list)
                                 and all(isinstance(x, str) for x in data[name])):
            raise ValueError(f"{path}: {name} must be a list of strings, not {data[name]!r}")
    unknown_kinds = set(data.get("pii_kinds", ())) - set(PII_KINDS)
    if unknown_kinds:
        raise ValueError(f"{path}: pii_kinds: unknown {sorted(unknown_kinds)}; known: "
                         f"{list(PII_KINDS)}")
    for pattern in data.get("secret_patterns", ()):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{path}: secret_patterns: {pattern!r} is not a regular "
                             f"expression ({exc})") from None
    conv: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    if "keys" in conv and not replace_defaults:
        conv["keys"] = tuple(dict.fromkeys(DEFAULT_REDACT_KEYS + conv["keys"]))
    return RedactionConfig(**conv)
