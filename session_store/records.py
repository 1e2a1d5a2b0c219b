"""What the log stores and hands back: recorded events and the hash chain that links them."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
import math
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import Any

from .errors import CorruptEvent
from .events import MAX_NESTING, Event, canonical_json, decode, nested_too_deeply

GENESIS_HASH = ""


def chain_hash(prev_hash: str, stream_id: str, version: int, event_type: str,
               schema_version: int, recorded_at_us: int, data_json: str) -> str:
    """Hash of one event, chained to the previous event of its stream (tamper evidence)."""
    h = hashlib.sha256()
    h.update("\x1f".join((prev_hash, stream_id, str(version), event_type, str(schema_version),
                          str(recorded_at_us), data_json)).encode())
    return h.hexdigest()


# `\uD800`-`\uDFFF` escaped in JSON text: a surrogate, half of a pair or alone.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _valid_unicode(data: Any) -> bool:
    try:
        canonical_json(data).encode()
    except UnicodeEncodeError:
        return False
    return True


def _not_json(constant: str) -> Any:
    # Python's reader takes NaN and Infinity; JSON has neither, and canonical_json never
    # writes them: a payload holding one was not written by the store, and every output
    # the tools make of it (JSON for scripts, the viewer's answers) would not be JSON.
    raise ValueError(f"{constant} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: no float holds it (Python reads inf)
        raise ValueError(f"{text[:40]} is not a number a float holds")
    return value


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: The last microsecond a date can show (9999-12-31T23:59:59.999999Z).
MAX_RECORDED_AT_US = 253402300799999999


def recorded_at_problem(us: int) -> str | None:
    """Why `us` is no time an event was recorded at, or None: before 1970 or after the year
    9999 no date can show it (2**63-1 made `state`, `export` and `tail` crash)."""
    if not 0 <= us <= MAX_RECORDED_AT_US:
        return (f"recorded_at_us {us} is outside 1970 to 9999 (0 to {MAX_RECORDED_AT_US} "
                "microseconds)")
    return None


@dataclass(frozen=True)
class RecordedEvent:
    """One stored event exactly as in its row. `event` decodes (and upcasts) on demand."""

    stream_id: str
    version: int
    position: int
    type: str
    schema_version: int
    data_json: str
    recorded_at_us: int
    hash: str

    @property
    def recorded_at(self) -> datetime:
        wrong = recorded_at_problem(self.recorded_at_us)
        if wrong:
            raise CorruptEvent(wrong, event_type=self.type, **self.where)
        return _EPOCH + timedelta(microseconds=self.recorded_at_us)

    @property
    def where(self) -> dict[str, Any]:
        return {"stream_id": self.stream_id, "version": self.version, "position": self.position}

    @property
    def data(self) -> dict[str, Any]:
        try:
            data = json.loads(self.data_json, parse_constant=_not_json, parse_float=_finite)
        except (ValueError, TypeError) as exc:
            raise CorruptEvent(f"payload is not valid JSON ({exc})", event_type=self.type,
                               **self.where) from None
        except RecursionError:
            # Valid JSON nested deeper than Python decodes (canonical_json could not have
            # encoded it either): a row named as corrupt, not a traceback from every reader.
            raise CorruptEvent("payload is nested too deeply to decode", event_type=self.type,
                               **self.where) from None
        if nested_too_deeply(self.data_json):
            # Decoded, but deeper than the store takes (canonical_json refuses it): every
            # reader after this would walk it recursively and fail with a traceback.
            raise CorruptEvent(f"payload is nested deeper than the {MAX_NESTING} levels the "
                               "log takes", event_type=self.type, **self.where)
        if _SURROGATE_ESCAPE.search(self.data_json) and not _valid_unicode(data):
            # An escaped lone surrogate decodes to a str no output can encode (UTF-8
            # refuses it): canonical_json never writes one, the store refuses such text.
            raise CorruptEvent("payload is not valid JSON (text that is not valid Unicode: "
                               "a lone surrogate)", event_type=self.type, **self.where)
        return data

    @cached_property
    def _decoded(self) -> Event:
        try:
            return decode(self.type, self.schema_version, self.data, where=self.where)
        except TypeError as exc:
            raise CorruptEvent(f"payload does not fit the type ({exc})", event_type=self.type,
                               **self.where) from None

    @property
    def event(self) -> Event:
        return self._decoded

    def to_json(self) -> dict[str, Any]:
        """Stable export form (one JSON Lines record)."""
        return {"stream_id": self.stream_id, "version": self.version, "position": self.position,
                "type": self.type, "schema_version": self.schema_version,
                "recorded_at": self.recorded_at.isoformat(), "data": self.data,
                "hash": self.hash}
