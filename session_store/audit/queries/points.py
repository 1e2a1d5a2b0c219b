"""A point in a call as a person writes it, resolved to a version (the CLI's `--at`/`--from`
and the viewer's `?at=` take the same forms)."""

from __future__ import annotations

from ..summaries import parse_point
from .reading import version_at_time


async def version_of_point(store, call_id: str, text: str) -> int:
    """`20` (version 20), `+1.6s` (that long after the call's first event) or an ISO 8601
    time (the last version recorded at or before it). ValueError: not a point. The version
    is not checked against the call's range: the caller says what its range is."""
    kind, value = parse_point(text)
    if kind == "version":
        return value
    if kind == "offset":
        first = await store.read(call_id, to_version=1)
        value += first[0].recorded_at_us if first else 0
    return await version_at_time(store, call_id, value)
