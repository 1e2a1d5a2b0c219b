"""What the log stores and hands back: recorded events and the hash chain that links them."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
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
        return datetime.fromtimestamp(self.recorded_at_us / 1e6, tz=timezone.utc)

    @property
    def where(self) -> dict[str, Any]:
        return {"stream_id": self.stream_id, "version": self.version, "position": self.position}

    @property
    def data(self) -> dict[str, Any]:
        try:
            data = json.loads(self.data_json, parse_constant=_not_json)
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
