"""How events are stored and read back: the Event base, the type registry, canonical JSON and
decoding with upcasters.

Each event type is a frozen dataclass registered under a stable type name and a schema
version (`event_type`). Stored form: (type, schema_version, canonical JSON data). Reading
applies the registered upcasters from the stored schema version up to the current one, so an
event written by older code still loads after its type gains a field. A type this code does
not know, or a schema version newer than it knows, raises a clear error naming the event:
skipping it would silently change the projection. The catalogue itself is events.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import CorruptEvent, SchemaVersionTooNew, UnknownEventType


class Event:
    """Base of every catalogue event. Subclasses are frozen dataclasses."""

    TYPE: ClassVar[str]
    SCHEMA: ClassVar[int]
    _FIELDS: ClassVar[tuple[str, ...]]
    _REQUIRED: ClassVar[frozenset[str]]
    _CHECKS: ClassVar[dict[str, Callable[[Any], bool]]]
    _COUNTS: ClassVar[frozenset[str]]  # its int fields (`out_of_range`)

    def to_data(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._FIELDS}


_CATALOGUE: dict[str, type[Event]] = {}
_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


@typing.dataclass_transform(frozen_default=True)  # (type checkers: a frozen dataclass)
def event_type(name: str, schema: int = 1):
    """Register a dataclass as catalogue event `name` at schema version `schema`."""

    def register(cls):
        cls = dataclass(frozen=True, slots=True)(cls)
        if name in _CATALOGUE:
            raise ValueError(f"event type {name!r} registered twice")
        cls.TYPE, cls.SCHEMA = name, schema
        fields = dataclasses.fields(cls)
        cls._FIELDS = tuple(f.name for f in fields)
        cls._REQUIRED = frozenset(
            f.name for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # noqa: BLE001 - an annotation we cannot resolve is not checked
            hints = {}
        cls._CHECKS = {f.name: _json_check(hints[f.name]) for f in fields if f.name in hints}
        cls._COUNTS = frozenset(f.name for f in fields
                                if hints.get(f.name) in (int, int | None))
        _CATALOGUE[name] = cls
        return cls

    return register


def _json_check(tp: Any) -> Callable[[Any], bool]:
    """Does a decoded JSON value fit annotation `tp`? A row whose value has the wrong type
    (a generation stored as "2", a list where a dict belongs) must not be folded: comparisons
    with it would silently come out wrong (a disconnect of generation 2 would not match
    generation "2", and the call would stay "connected")."""
    if tp is Any:
        return lambda v: True
    if tp is bool:
        return lambda v: isinstance(v, bool)
    if tp is int:  # every int of the catalogue counts something (`out_of_range`)
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                          and math.isfinite(v))
    if tp is str:
        return lambda v: isinstance(v, str)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        checks = [_json_check(a) for a in args]
        return lambda v: any(c(v) for c in checks)
    if tp is type(None):
        return lambda v: v is None
    if origin is list:
        item = _json_check(args[0]) if args else (lambda v: True)
        return lambda v: isinstance(v, list) and all(item(x) for x in v)
    if origin is dict or tp is dict:
        return lambda v: isinstance(v, dict)
    return lambda v: True  # anything else: not checked


def upcaster(name: str, from_schema: int):
    """Register how data of `name` at `from_schema` becomes data at `from_schema + 1`."""

    def register(fn):
        _UPCASTERS[(name, from_schema)] = fn
        return fn

    return register


def catalogue() -> dict[str, type[Event]]:
    return dict(_CATALOGUE)


def field_defaults(name: str) -> dict[str, Any]:
    """The default of each field of event type `name` that has one ({} if unknown): what a
    log written before the field existed means by leaving it out."""
    cls = _CATALOGUE.get(name)
    if cls is None:
        return {}
    return {f.name: f.default for f in dataclasses.fields(typing.cast(Any, cls))
            if f.default is not dataclasses.MISSING}


# Built once: json.dumps with options builds a new encoder on every call (it is on the append
# hot path, bench/append.py).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)


#: The deepest nesting of arrays and objects an event may hold. Every reader walks payloads
#: recursively (redaction, the viewer's templates, rich): one a few hundred levels deep
#: stored fine and then broke every reader with a RecursionError. No tool result or message
#: of a call comes near it.
MAX_NESTING = 100

# A JSON string (skipped: brackets inside it do not nest) or one bracket.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def nested_too_deeply(text: str) -> bool:
    """Do arrays and objects nest more than MAX_NESTING levels deep in this JSON text?"""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return False  # (every payload but a big one: two counts, no scan)
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        bracket = token.group()
        if bracket in ("[", "{"):
            depth += 1
            if depth > MAX_NESTING:
                return True
        elif bracket in ("]", "}"):
            depth -= 1
    return False


def canonical_json(data: Any) -> str:
    """The one JSON spelling of a value: hashed, stored and compared byte for byte.
    ValueError for what the log cannot store: NaN or infinities, a value nested deeper than
    MAX_NESTING levels (TypeError: not JSON at all)."""
    try:
        text = _CANONICAL.encode(data)
    except RecursionError:
        raise ValueError(f"nested deeper than the {MAX_NESTING} levels the log takes") \
            from None
    if nested_too_deeply(text):
        raise ValueError(f"nested deeper than the {MAX_NESTING} levels the log takes")
    return text


def decode(event_type_name: str, schema_version: int, data: dict[str, Any], *,
           where: dict[str, Any] | None = None) -> Event:
    """Build the typed event from its stored parts, upcasting old schema versions."""
    where = where or {}
    cls = _CATALOGUE.get(event_type_name)
    if cls is None:
        raise UnknownEventType(
            f"unknown event type; this code knows {len(_CATALOGUE)} types — "
            "was the log written by a newer version?", event_type=event_type_name, **where)
    if schema_version > cls.SCHEMA:
        raise SchemaVersionTooNew(
            f"schema version {schema_version} is newer than this code's {cls.SCHEMA}; "
            "upgrade the code before reading this log", event_type=event_type_name, **where)
    if not isinstance(data, dict):
        raise CorruptEvent(f"payload must be a JSON object, got {type(data).__name__}",
                           event_type=event_type_name, **where)
    version = schema_version
    while version < cls.SCHEMA:
        step = _UPCASTERS.get((event_type_name, version))
        if step is None:
            raise CorruptEvent(f"no upcaster from schema {version}", event_type=event_type_name,
                               **where)
        data = step(dict(data))
        version += 1
    missing = cls._REQUIRED - data.keys()
    if missing:
        raise CorruptEvent(f"payload lacks field(s) {sorted(missing)}",
                           event_type=event_type_name, **where)
    for name, check in cls._CHECKS.items():
        if name in data and not check(data[name]):
            raise CorruptEvent(
                f"field {name!r} holds {type(data[name]).__name__} {_short(data[name])}, "
                f"which does not fit its type", event_type=event_type_name, **where)
    wrong = out_of_range(cls, data)
    if wrong:
        raise CorruptEvent(wrong, event_type=event_type_name, **where)
    # Tolerant reader: fields added by newer writers at the same schema are ignored.
    return cls(**{k: data[k] for k in cls._FIELDS if k in data})


#: The largest int an event's field holds: a BIGINT, as every version and timestamp.
MAX_COUNT = 2**63 - 1


def out_of_range(cls: type[Event], data: dict[str, Any]) -> str | None:
    """What is wrong with an event's int fields, or None. Each counts something (a
    generation, an attempt, a version, an epoch, a part) from 0 to MAX_COUNT: -5 or 10**40
    was stored and read back silently, and broke whatever compared or stored it next."""
    for name in cls._COUNTS:
        value = data.get(name)
        if type(value) is int and not 0 <= value <= MAX_COUNT:
            return (f"field {name!r} holds {_short(value)}, outside the 0 to 2^63-1 a count "
                    "of the log holds")
    return None


def _short(value: Any) -> str:
    """What a mistyped field holds, for its error: a number, bool or null as it is; text and
    containers by their size only. Errors are printed by every reader, under --redact too,
    and a transcript or a tool argument is where a caller's personal data lives."""
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, str):
        return f"of {len(value)} character{'s' if len(value) != 1 else ''}"
    if isinstance(value, (list, dict)):
        return f"of {len(value)} item{'s' if len(value) != 1 else ''}"
    return "(a value JSON cannot hold)"
