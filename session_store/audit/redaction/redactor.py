"""The `Redactor`: masks event data, observations, replay items and projected state.

Secrets always (`rules.py`); with full redaction on, what the config names and the
personal data found in free text (`..pii`). It fails closed: what it cannot read or does
not know is masked whole.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from ...errors import CorruptEvent, EventDecodeError
from ...events import canonical_json, catalogue
from ...records import RecordedEvent
from ..fmt import stored_length
from ..pii import SCAN_MAX, PiiScanner
from .config import RedactionConfig
from .rules import (
    ALWAYS_SECRET_KEY_PARTS, ALWAYS_SECRET_PATTERNS, ARGS_PREVIEW_KEYS, MASK, QUOTED_INPUT,
    normalised_key,
)


def _fields_understood(event_type: str, schema_version: int | None) -> frozenset[str] | None:
    """The payload fields this code knows for the type at that schema version (None: the
    current one); None if it does not know the type or the version is newer than its own."""
    cls = catalogue().get(event_type)
    if cls is None or (schema_version is not None and schema_version > cls.SCHEMA):
        return None
    return frozenset(cls._FIELDS)


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


_LANGUAGE_REGION = re.compile(r"[A-Za-z]{2,3}[-_]([A-Za-z]{2})$")


class Redactor:
    """Applies a RedactionConfig to event data, recorded events and projected state."""

    def __init__(self, config: RedactionConfig | None = None):
        self.config = config or RedactionConfig()
        self._parts = tuple(normalised_key(p) for p in ALWAYS_SECRET_KEY_PARTS + self.config.secret_keys)
        self._patterns = tuple(re.compile(p) for p in
                               ALWAYS_SECRET_PATTERNS + self.config.secret_patterns)
        # Each key pattern as written and without separators, matched against the key as
        # written and without separators: `phone_number` also catches `phoneNumber` and
        # `phone-number` (tool schemas spell fields either way). One regex for all of them.
        patterns = {p for k in self.config.keys for p in (k.lower(), normalised_key(k))}
        self._keys = (re.compile("|".join(fnmatch.translate(p) for p in sorted(patterns)))
                      if patterns else None)
        cfg = self.config
        self._pii = (PiiScanner(tuple(cfg.pii_kinds), tuple(cfg.phone_regions))
                     if cfg.enabled and cfg.free_text_pii and cfg.pii_kinds else None)
        # Phone regions each call has shown so far (`learn_regions`), and those of the
        # call being redacted now.
        self._learnt: OrderedDict[str, set[str]] = OrderedDict()
        self._regions: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    # ------------------------------------------------------------------ key tests
    def is_secret_key(self, key: str) -> bool:
        n = normalised_key(key)
        return any(p in n for p in self._parts)

    def is_configured_key(self, key: str) -> bool:
        if not self.config.enabled or self._keys is None:
            return False
        return bool(self._keys.match(key.lower()) or self._keys.match(normalised_key(key)))

    # ------------------------------------------------------------------ values
    def scrub_text(self, text: str) -> str:
        """Mask credential-looking substrings of a string (always applied)."""
        for pat in self._patterns:
            text = pat.sub(MASK, text)
        return text

    def _walk(self, value: Any, path: str, masked: list[str], *, all_leaves: bool = False,
              pii: bool = False) -> Any:
        """Secrets masked by key and pattern; configured keys masked; with `pii`, personal
        data in the strings that stay (free text: arguments, results, messages)."""
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                sub = f"{path}.{k}"
                if isinstance(k, str) and (self.is_secret_key(k) or self.is_configured_key(k)):
                    out[k] = self._mask(v, sub, masked)
                else:
                    out[k] = self._walk(v, sub, masked, all_leaves=all_leaves, pii=pii)
            return out
        if isinstance(value, list):
            return [self._walk(v, f"{path}[{i}]", masked, all_leaves=all_leaves, pii=pii)
                    for i, v in enumerate(value)]
        if all_leaves and value is not None:
            masked.append(path)
            return MASK
        if isinstance(value, str):
            inner = self._json_text(value, path, all_leaves, pii)
            if inner is not None:
                masked.append(path)
                return inner
            scrubbed = self.scrub_text(value)
            if pii and self._pii is not None:
                scrubbed = self.mask_pii(scrubbed)
            if scrubbed != value:
                masked.append(path)
            return scrubbed
        return value

    def mask_pii(self, text: str) -> str:
        """Personal data in a free text masked ("[REDACTED:phone]"); a text too long to
        scan is masked whole, and so is a preview of one (a fold of previews shows what the
        whole value shows). Unchanged when full redaction or the scan is off."""
        if self._pii is None or not text:
            return text
        if stored_length(text) > SCAN_MAX:
            return MASK
        return self._pii.mask(text, call_regions=self._regions)[0]

    def learn_regions(self, call: str, value: Any) -> tuple[str, ...]:
        """Where the call's local-form phone numbers are read, learnt from what it has shown
        so far: the country of its `language` setting (`de-DE`) and of every number given
        with its country code (the caller's own number, a tool's lookup). Regions stay
        learnt for the call (the last 1,024 calls), so a later local number is read in them."""
        if self._pii is None:
            return ()
        found = self._learnt.pop(call, set())
        self._learnt[call] = found
        if len(self._learnt) > 1024:
            self._learnt.popitem(last=False)
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                for k, item in v.items():
                    if k == "language" and isinstance(item, str):
                        m = _LANGUAGE_REGION.search(item)
                        found.update([m.group(1).upper()] if m else ())
                    stack.append(item)
            elif isinstance(v, list):
                stack.extend(v)
            elif isinstance(v, str) and "+" in v and len(v) <= SCAN_MAX:
                found |= self._pii.regions_in(v)
        return tuple(sorted(found))

    def _json_text(self, text: str, path: str, all_leaves: bool,
                   pii: bool = False) -> str | None:
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
            out = self._walk(value, path, inner, all_leaves=all_leaves, pii=pii)
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
        self._regions = self.learn_regions(rec.stream_id, data)
        try:
            return self._redact_readable(rec, data)
        finally:
            self._regions = ()

    def _redact_readable(self, rec: RecordedEvent,
                         data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
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
                                     all_leaves=cfg.tool_results == "all", pii=True)
        elif event_type == "tool.call_failed" and "error" in d:
            d["error"] = (self._mask(d["error"], "data.error", masked)
                          if cfg.tool_results == "all"
                          else self._walk(d["error"], "data.error", masked, pii=True))
        elif event_type in ("conversation.message", "conversation.message_cut") and "text" in d:
            d["text"] = self._transcript(d["text"], "data.text", masked)
        elif event_type == "anomaly.recorded" and isinstance(d.get("detail"), dict):
            d["detail"] = self._anomaly_detail(d["detail"], "data.detail", masked)
        elif event_type == "decision.observed" and isinstance(d.get("data"), dict):
            d["data"] = self._logged_observation(d.get("kind"), d["data"], masked)
        if event_type in ("connection.connected", "connection.handle_issued",
                          "connection.handle_withheld", "connection.handle_refused"):
            if d.get("handle") is not None and cfg.handles:
                d["handle"] = self.fingerprint(d["handle"])
                masked.append("data.handle")
        return d

    def _transcript(self, text: Any, path: str, masked: list[str]) -> Any:
        """What was said: masked whole under `transcripts`, else its personal data."""
        return (self._mask(text, path, masked) if self.config.transcripts
                else self._walk(text, path, masked, pii=True))

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
        return self._walk(args, path, masked, all_leaves=self.config.tool_args == "all",
                          pii=True)

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
            scrubbed = QUOTED_INPUT.sub(f"input_value={MASK}", error)
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
        return self._walk(detail, path, masked, pii=True)

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
        elif kind == "TranscriptFlushed":
            # The caller's words are kept in their pieces, and the bot's where no message
            # holds them: transcripts, as the messages are.
            for i, piece in enumerate(o.get("words") or []):
                if isinstance(piece, list) and piece and isinstance(piece[0], str):
                    piece[0] = self._transcript(piece[0], f"observation.words[{i}]", masked)
            if isinstance(o.get("said"), str) and o["said"]:
                o["said"] = self._transcript(o["said"], "observation.said", masked)

    def _logged_observation(self, kind: Any, data: dict[str, Any],
                            masked: list[str]) -> dict[str, Any]:
        """A logged observation's own fields (what its events hold is referenced, not
        copied): redacted as a replayed observation, and where it carries a result, a
        reason or an event, as those are."""
        o = {**json.loads(json.dumps(data, default=str)), "observation": kind}
        self._full_observation(o, masked)
        o.pop("observation")
        cfg = self.config
        if (kind in ("SessionReady", "HandshakeFailed", "HandleArrived")
                and isinstance(o.get("handle"), str)
                and cfg.handles):
            o["handle"] = self.fingerprint(o["handle"])
            masked.append("data.data.handle")
        elif kind in ("ProgressReturned", "ResultArrived") and "value" in o:
            o["value"] = self._walk(o["value"], "data.data.value", masked,
                                    all_leaves=cfg.tool_results == "all", pii=True)
        elif kind == "OutcomeAnswered" and isinstance(o.get("answer"), dict):
            for key in ("result", "reason", "preview"):  # (preview: of what is no answer)
                if key in o["answer"]:
                    o["answer"][key] = self._walk(o["answer"][key], f"data.data.answer.{key}",
                                                  masked, all_leaves=cfg.tool_results == "all",
                                                  pii=True)
        elif kind == "ResultReturned" and isinstance(o.get("outcome"), list):
            o["outcome"] = [self.redact_replay_item(x) if isinstance(x, dict) else x
                            for x in o["outcome"]]
        return o

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
        """Redact a state view (`export.state_view`, `models.State`) or a part of one."""
        masked: list[str] = []
        s = _json_copy(state_json)
        cfg = self.config
        call = s.get("call")
        self._regions = self.learn_regions(call, s) if isinstance(call, str) else ()
        try:
            return self._redact_state(s, masked)
        finally:
            self._regions = ()

    def _redact_state(self, s: dict[str, Any], masked: list[str]) -> dict[str, Any]:
        cfg = self.config
        if cfg.enabled:
            if cfg.settings_values and isinstance(s.get("settings"), dict):
                s["settings"] = {k: self._mask(v, "settings", masked)
                                 for k, v in s["settings"].items()}
            calls = [c for c in s.get("tool_calls") or () if isinstance(c, dict)]
            for c in calls:
                if "args" in c:
                    c["args"] = self._args(c["args"], "args", masked)
                if "result" in c:
                    c["result"] = self._walk(c["result"], "result", masked,
                                             all_leaves=cfg.tool_results == "all", pii=True)
                if c.get("error") is not None:
                    c["error"] = (MASK if cfg.tool_results == "all"
                                  else self._walk(c["error"], "error", masked, pii=True))
            if isinstance(s.get("conversation"), list):
                ids = {c.get("tool_call_id") for c in calls}
                s["conversation"] = [self._turn(t, ids, masked) for t in s["conversation"]]
            if cfg.handles:
                self._fingerprint_handles(s)
        return self._walk(s, "state", masked)

    def _turn(self, turn: Any, tool_call_ids: set, masked: list[str]) -> Any:
        """A conversation turn of a state view. {"role": "tool", "text": id} marks where a
        call went; a message logged with the role "tool" looks the same, so only an id of a
        call the view shows is kept."""
        if not isinstance(turn, dict):
            return MASK
        text = turn.get("text")
        if turn.get("role") == "tool" and isinstance(text, str) and text in tool_call_ids:
            return turn
        if self.config.transcripts:
            return {**turn, "text": MASK}
        return {**turn, "text": self._walk(text, "conversation", masked, pii=True)}

    def _fingerprint_handles(self, s: dict[str, Any]) -> None:
        for h in s.get("handles") or ():
            if isinstance(h, dict):
                h["handle"] = self.fingerprint(h.get("handle"))
        if "newest_handle" in s:
            s["newest_handle"] = self.fingerprint(s["newest_handle"])
        for g in s.get("generations") or ():
            if isinstance(g, dict) and g.get("handle"):
                g["handle"] = self.fingerprint(g["handle"])


def _json_copy(value: Any) -> Any:
    """`json.loads(json.dumps(value))` without the text: containers copied (redaction
    changes them in place), strings and numbers shared (a state's 10 MB transcripts were
    written out and read back, twice the call in memory)."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else next(iter(json.loads(json.dumps({k: 0})))):
                _json_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_copy(v) for v in value]
    return value
