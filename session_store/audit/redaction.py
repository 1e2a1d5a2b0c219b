"""Redaction of event data and projected state (pure; no I/O except reading a config file).

Two levels:

* **Always** (every output of the CLI and the web viewer, with or without --redact): any
  value under a key whose name contains a secret word ("api_key", "token", "secret",
  "password", "authorization", …, compared case-insensitively with `_`/`-`/`.` removed) is
  masked at any depth, in any event, and substrings that look like credentials ("sk-…",
  "AIza…", "Bearer …", JWTs, "api_key=…") are masked inside every string.
* **Full** (`--redact`, `?redact=1`, or a config that turns it on): additionally the
  configured fields — tool arguments and results by key name (or all of them), transcript
  text (conversation.message), settings values — and resumption handles (replaced by a short
  fingerprint, so the timeline still shows which handle a session resumed from). It fails
  closed: a preview of arguments kept as JSON text, a row that cannot be read, a type or
  schema version this code does not know, and a field it does not know are masked whole,
  since nothing says which of their parts are transcripts or personal data.

A masked value becomes the string "[REDACTED]"; containers keep their shape (a dict stays a
dict, with its leaves masked), so a redacted event still decodes and folds.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CorruptEvent, EventDecodeError
from ..events import canonical_json, catalogue
from ..records import RecordedEvent

MASK = "[REDACTED]"
# pydantic's quote of a refused value in a validation error: up to its `input_type`, or to
# the end of the line when the error was cut short before it.
_QUOTED_INPUT = re.compile(r"input_value=.*?(?=, input_type=|$)", re.MULTILINE)

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

#: Argument/result keys masked by default when full redaction is on (personal data).
DEFAULT_REDACT_KEYS: tuple[str, ...] = (
    "email", "phone", "phone_number", "mobile", "address", "street", "postcode", "zip",
    "card_number", "card", "cvv", "iban", "account_number", "ssn", "date_of_birth", "dob",
    "pin", "otp")

#: Where `decide` keeps tool arguments it could not store as they came (too large, not valid
#: JSON): the start of their JSON text, whose keys the key walk cannot see.
ARGS_PREVIEW_KEYS: tuple[str, ...] = ("_preview", "_invalid")

ENV_CONFIG = "SESSION_STORE_REDACT_CONFIG"
ENV_KEYS = "SESSION_STORE_REDACT_KEYS"


def _norm(key: str) -> str:
    return re.sub(r"[\s_\-.]", "", key.lower())


def _fields_understood(event_type: str, schema_version: int | None) -> frozenset[str] | None:
    """The payload fields this code knows for the type at that schema version (None: the
    current one); None if it does not know the type or the version is newer than its own."""
    cls = catalogue().get(event_type)
    if cls is None or (schema_version is not None and schema_version > cls.SCHEMA):
        return None
    return frozenset(cls._FIELDS)


def _masked_turn(turn: Any, calls: dict[str, Any]) -> Any:
    """A conversation entry of a state view under transcript redaction. ("tool", call id)
    marks where a call went; a message logged with the role "tool" looks the same, so only
    an id of a call the view shows is kept."""
    if not isinstance(turn, list) or not turn:
        return turn
    if turn[0] == "tool" and len(turn) == 2 and isinstance(turn[1], str) and turn[1] in calls:
        return turn
    return [turn[0], MASK]


def _mistyped(rec: RecordedEvent) -> bool:
    """Does this row's payload not fit its (known) type? Unknown types and newer schema
    versions are told apart by `_fields_understood`, not here."""
    try:
        rec.event  # noqa: B018 - decoding checks every field's type
    except CorruptEvent:
        return True
    except EventDecodeError:
        return False
    return False


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

    def with_enabled(self, enabled: bool = True) -> "RedactionConfig":
        return dataclasses.replace(self, enabled=enabled)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_config(*, redact: bool = False, keys: str | None = None, path: str | None = None,
                env: dict[str, str] | None = None) -> RedactionConfig:
    """Combine a config file (--redact-config or $SESSION_STORE_REDACT_CONFIG, JSON or TOML),
    $SESSION_STORE_REDACT_KEYS and --redact-keys. Giving keys implies full redaction; a file
    with `enabled = true` forces it for every output."""
    env = os.environ if env is None else env
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
    for name in ("enabled", "transcripts", "settings_values", "handles"):
        if name in data and not isinstance(data[name], bool):
            raise ValueError(f"{path}: {name} must be true or false, not {data[name]!r}")
    for name in ("keys", "secret_keys", "secret_patterns"):
        if name in data and not (isinstance(data[name], list)
                                 and all(isinstance(x, str) for x in data[name])):
            raise ValueError(f"{path}: {name} must be a list of strings, not {data[name]!r}")
    for pattern in data.get("secret_patterns", ()):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{path}: secret_patterns: {pattern!r} is not a regular "
                             f"expression ({exc})") from None
    conv = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    if "keys" in conv and not replace_defaults:
        conv["keys"] = tuple(dict.fromkeys(DEFAULT_REDACT_KEYS + conv["keys"]))
    return RedactionConfig(**conv)


@dataclass
class _Pass:
    """One redaction pass: the config compiled, and the JSON paths it masked."""
    config: RedactionConfig
    secret_parts: tuple[str, ...]
    patterns: tuple[re.Pattern, ...]
    masked: list[str] = field(default_factory=list)


class Redactor:
    """Applies a RedactionConfig to event data, recorded events and projected state."""

    def __init__(self, config: RedactionConfig | None = None):
        self.config = config or RedactionConfig()
        self._parts = tuple(_norm(p) for p in ALWAYS_SECRET_KEY_PARTS + self.config.secret_keys)
        self._patterns = tuple(re.compile(p) for p in
                               ALWAYS_SECRET_PATTERNS + self.config.secret_patterns)
        # Each key pattern as written and without separators, matched against the key as
        # written and without separators: `phone_number` also catches `phoneNumber` and
        # `phone-number` (tool schemas spell fields either way). One regex for all of them.
        patterns = {p for k in self.config.keys for p in (k.lower(), _norm(k))}
        self._keys = (re.compile("|".join(fnmatch.translate(p) for p in sorted(patterns)))
                      if patterns else None)

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    # ------------------------------------------------------------------ key tests
    def is_secret_key(self, key: str) -> bool:
        n = _norm(key)
        return any(p in n for p in self._parts)

    def is_configured_key(self, key: str) -> bool:
        if not self.config.enabled or self._keys is None:
            return False
        return bool(self._keys.match(key.lower()) or self._keys.match(_norm(key)))

    # ------------------------------------------------------------------ values
    def scrub_text(self, text: str) -> str:
        """Mask credential-looking substrings of a string (always applied)."""
        for pat in self._patterns:
            text = pat.sub(MASK, text)
        return text

    def _walk(self, value: Any, path: str, masked: list[str], *, all_leaves: bool = False) -> Any:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                sub = f"{path}.{k}"
                if isinstance(k, str) and (self.is_secret_key(k) or self.is_configured_key(k)):
                    out[k] = self._mask(v, sub, masked)
                else:
                    out[k] = self._walk(v, sub, masked, all_leaves=all_leaves)
            return out
        if isinstance(value, list):
            return [self._walk(v, f"{path}[{i}]", masked, all_leaves=all_leaves)
                    for i, v in enumerate(value)]
        if all_leaves and value is not None:
            masked.append(path)
            return MASK
        if isinstance(value, str):
            inner = self._json_text(value, path, all_leaves)
            if inner is not None:
                masked.append(path)
                return inner
            scrubbed = self.scrub_text(value)
            if scrubbed != value:
                masked.append(path)
            return scrubbed
        return value

    def _json_text(self, text: str, path: str, all_leaves: bool) -> str | None:
        """A string that is itself a JSON object or array (a tool returning
        `json.dumps(record)`): its keys are keys all the same, so it is redacted as the value
        it spells. The redacted JSON text, or None if it is not JSON or nothing in it goes."""
        if text.lstrip()[:1] not in ("{", "["):
            return None
        try:
            value = json.loads(text)
            if not isinstance(value, (dict, list)):
                return None
            inner: list[str] = []
            out = self._walk(value, path, inner, all_leaves=all_leaves)
        except ValueError:
            return None
        except RecursionError:  # nested too deep to walk: what it holds cannot be told
            return MASK if self.config.enabled else None
        if not inner:
            return None
        text = json.dumps(out, ensure_ascii=False)
        try:
            text.encode()
        except UnicodeEncodeError:  # it escaped a lone surrogate: written back escaped
            text = json.dumps(out)
        return text

    def _mask(self, value: Any, path: str, masked: list[str]) -> Any:
        """Mask a whole value but keep a container's shape."""
        if isinstance(value, dict):
            return {k: self._mask(v, f"{path}.{k}", masked) for k, v in value.items()}
        if isinstance(value, list):
            return [self._mask(v, f"{path}[{i}]", masked) for i, v in enumerate(value)]
        if value is None:
            return None
        masked.append(path)
        return MASK

    def fingerprint(self, handle: Any) -> Any:
        if not isinstance(handle, str) or not (self.config.enabled and self.config.handles):
            return handle
        return f"handle:{hashlib.sha256(handle.encode()).hexdigest()[:12]}"

    # ------------------------------------------------------------------ events
    def redact_data(self, event_type: str, data: dict[str, Any], *,
                    schema_version: int | None = None) -> tuple[dict[str, Any], list[str]]:
        """(redacted copy of an event's data, JSON paths masked). `schema_version`: the
        stored one (None: this code's own, as for an event it built)."""
        masked: list[str] = []
        out = dict(data)
        if self.config.enabled:
            out = self._full(event_type, schema_version, out, masked)
        out = self._walk(out, "data", masked)
        return out, sorted(set(masked))

    def redact_stored(self, rec: RecordedEvent) -> tuple[dict[str, Any], list[str]]:
        """A stored row's payload redacted by its type and schema version, and the paths
        masked. A payload that cannot be read as an event's data (torn write, bad disk, not
        an object) is shown scrubbed of credentials, and masked whole under full redaction:
        which of its parts are transcripts cannot be told."""
        try:
            data = rec.data
            if not isinstance(data, dict):  # valid JSON, but no event payload is a list
                raise TypeError("not an object")
        except Exception:  # noqa: BLE001 - corrupt payloads are shown scrubbed, never raw
            text = MASK if self.config.enabled else self.scrub_text(rec.data_json)
            return {"_unreadable": text}, ["data"]
        if self.config.enabled and _mistyped(rec):
            # A known type whose fields do not fit it (settings as a list of pairs, arguments
            # as a list): the per-field rules would miss what they cannot recognise.
            masked: list[str] = []
            return self._mask(data, "data", masked), sorted(set(masked))
        return self.redact_data(rec.type, data, schema_version=rec.schema_version)

    def _full(self, event_type: str, schema_version: int | None, d: dict[str, Any],
              masked: list[str]) -> dict[str, Any]:
        fields = _fields_understood(event_type, schema_version)
        if fields is None:
            # Written by newer code (or not an event): which of its fields hold transcripts
            # or arguments is unknown here, so every value goes; names and shape stay.
            return self._mask(d, "data", masked)
        for key in sorted(d.keys() - fields):  # a field newer code added at this version
            d[key] = self._mask(d[key], f"data.{key}", masked)
        cfg = self.config
        if event_type in ("session.opened", "settings.changed"):
            key = "settings" if event_type == "session.opened" else "values"
            if cfg.settings_values and isinstance(d.get(key), dict):
                d[key] = {k: self._mask(v, f"data.{key}.{k}", masked) for k, v in d[key].items()}
        elif event_type == "tool.call_requested" and "args" in d:
            d["args"] = self._args(d["args"], "data.args", masked)
        elif event_type == "tool.call_completed" and "result" in d:
            d["result"] = self._walk(d["result"], "data.result", masked,
                                     all_leaves=cfg.tool_results == "all")
        elif event_type == "tool.call_failed" and cfg.tool_results == "all" and "error" in d:
            d["error"] = self._mask(d["error"], "data.error", masked)
        elif event_type == "conversation.message" and cfg.transcripts and "text" in d:
            d["text"] = self._mask(d["text"], "data.text", masked)
        elif event_type == "anomaly.recorded" and isinstance(d.get("detail"), dict):
            d["detail"] = self._anomaly_detail(d["detail"], "data.detail", masked)
        if event_type in ("connection.connected", "connection.handle_issued",
                          "connection.handle_withheld"):
            if d.get("handle") is not None and cfg.handles:
                d["handle"] = self.fingerprint(d["handle"])
                masked.append("data.handle")
        return d

    def _args(self, args: Any, path: str, masked: list[str]) -> Any:
        """Tool arguments under full redaction: by configured key (or every leaf). A preview
        `decide` wrote in their place (an anomaly's `args`, `args._preview`/`_invalid`) is
        JSON text cut short, whose keys cannot be matched: masked whole."""
        if isinstance(args, str):
            return self._mask(args, path, masked)
        if isinstance(args, dict):
            args = {k: self._mask(v, f"{path}.{k}", masked)
                    if k in ARGS_PREVIEW_KEYS and isinstance(v, str) else v
                    for k, v in args.items()}
        return self._walk(args, path, masked, all_leaves=self.config.tool_args == "all")

    def _anomaly_detail(self, detail: dict[str, Any], path: str,
                        masked: list[str]) -> dict[str, Any]:
        cfg = self.config
        detail = dict(detail)
        if "args" in detail:
            detail["args"] = self._args(detail["args"], f"{path}.args", masked)
        # The start of a frame the service could not take in, or of a value it could not
        # store: JSON text cut short, which may carry transcripts, arguments or results and
        # in which no key can be matched, so masked whole whatever the config shows (an
        # unstorable result's preview holds the result's personal data). The SDK's error,
        # which may quote the frame, goes with the transcripts: it is also the diagnostic.
        # Kind, sizes and field names stay visible.
        for key in ("frame", "preview", "error"):
            if isinstance(detail.get(key), str) and (key != "error" or cfg.transcripts
                                                     or cfg.tool_args == "all"):
                detail[key] = self._mask(detail[key], f"{path}.{key}", masked)
        error = detail.get("error")
        if isinstance(error, str) and error != MASK:
            # Kept as the diagnostic, but the SDK's validation errors quote the value they
            # refused (`input_value='bob@example.com order 42'`: a malformed toolCall's
            # arguments, a transcript): the value goes, where and why it failed stays.
            scrubbed = _QUOTED_INPUT.sub(f"input_value={MASK}", error)
            if scrubbed != error:
                detail["error"] = scrubbed
                masked.append(f"{path}.error")
        handle = detail.get("handle")
        if cfg.handles and isinstance(handle, str) and handle:
            # A refused resumption (handshake_failed): fingerprinted as connection events
            # are, also where the error text quotes it.
            fp = self.fingerprint(handle)
            detail = {k: v.replace(handle, fp) if isinstance(v, str) else v
                      for k, v in detail.items()}
            masked.append(f"{path}.handle")
        return detail

    def redact_observation(self, obs: dict[str, Any]) -> dict[str, Any]:
        """A replayed observation (`observation_json`): it carries what the events decided
        on it carry (tool arguments, a rejected message's detail, settings values), so it
        is redacted as they are."""
        masked: list[str] = []
        # JSON types only (deep copy): dataclasses.asdict leaves the calls in a tuple.
        o = json.loads(json.dumps(obs, default=str))
        if self.config.enabled:
            self._full_observation(o, masked)
        return self._walk(o, "observation", masked)

    def _full_observation(self, o: dict[str, Any], masked: list[str]) -> None:
        kind = o.get("observation")
        if kind == "ToolCallsArrived":
            for i, call in enumerate(o.get("calls") or []):
                if isinstance(call, dict) and "args" in call:
                    call["args"] = self._args(call["args"], f"observation.calls[{i}].args",
                                              masked)
        elif kind == "ServerMessageRejected" and isinstance(o.get("detail"), dict):
            o["detail"] = self._anomaly_detail(o["detail"], "observation.detail", masked)
        elif kind == "SettingsUpdate" and self.config.settings_values and "values" in o:
            o["values"] = self._mask(o["values"], "observation.values", masked)

    def redact_replay_item(self, item: dict[str, Any]) -> dict[str, Any]:
        """A logged or decided item of a replay divergence: an event ({"type", "data"}), an
        effect ({"effect", …}) or a resumption choice ({"resume_from": handle})."""
        if isinstance(item.get("type"), str) and isinstance(item.get("data"), dict):
            return {**item, "data": self.redact_data(item["type"], item["data"])[0]}
        if "resume_from" in item:
            item = {**item, "resume_from": self.fingerprint(item["resume_from"])}
        return self._walk(item, "item", [])

    def redact_record(self, rec: RecordedEvent) -> RecordedEvent:
        """The same record with redacted data (its hash still the stored one)."""
        data, masked = self.redact_stored(rec)
        if not masked:
            return rec
        return dataclasses.replace(rec, data_json=canonical_json(data))

    def redact_records(self, recs: Iterable[RecordedEvent]) -> list[RecordedEvent]:
        return [self.redact_record(r) for r in recs]

    # ------------------------------------------------------------------ state
    def redact_state(self, state_json: dict[str, Any]) -> dict[str, Any]:
        """Redact a projected state (SessionState.to_json() or a view of it)."""
        masked: list[str] = []
        s = json.loads(json.dumps(state_json))  # deep copy, JSON types only
        cfg = self.config
        if cfg.enabled:
            if cfg.settings_values and isinstance(s.get("settings"), dict):
                s["settings"] = {k: self._mask(v, "settings", masked)
                                 for k, v in s["settings"].items()}
            for c in (s.get("calls") or {}).values():
                if not isinstance(c, dict):
                    continue
                if "args" in c:
                    c["args"] = self._args(c["args"], "args", masked)
                if "result" in c:
                    c["result"] = self._walk(c["result"], "result", masked,
                                             all_leaves=cfg.tool_results == "all")
                if cfg.tool_results == "all" and c.get("error") is not None:
                    c["error"] = MASK
            if cfg.transcripts and isinstance(s.get("conversation"), list):
                calls = s.get("calls") if isinstance(s.get("calls"), dict) else {}
                s["conversation"] = [_masked_turn(m, calls) for m in s["conversation"]]
            if cfg.handles:
                self._fingerprint_handles(s)
        return self._walk(s, "state", masked)

    def _fingerprint_handles(self, s: dict[str, Any]) -> None:
        if isinstance(s.get("handles"), dict):
            s["handles"] = {self.fingerprint(k): {**h, "handle": self.fingerprint(h.get("handle"))}
                            for k, h in s["handles"].items()}
        for key in ("newest_handle",):
            if key in s:
                s[key] = self.fingerprint(s[key])
        for g in (s.get("generations") or {}).values():
            if isinstance(g, dict) and g.get("handle"):
                g["handle"] = self.fingerprint(g["handle"])
