"""The published outputs by name (`session-store schema NAME`) and their JSON Schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from .base import Out
from .calls import CallPage
from .checks import Replay, Verify
from .state import ExportLine, State
from .stats import Stats
from .timeline import LiveUpdate, Timeline


class Error(Out):
    """Any web API error (4xx, 5xx)."""
    error: str
    call: str | None = None


#: The published outputs, by the name `session-store schema NAME` takes.
SCHEMAS: dict[str, type[BaseModel]] = {
    "call-page": CallPage, "timeline": Timeline, "state": State, "export-line": ExportLine,
    "verify": Verify, "replay": Replay, "stats": Stats, "live-update": LiveUpdate,
    "error": Error,
}


def schema_of(name: str) -> dict[str, Any]:
    if name not in SCHEMAS:
        raise KeyError(name)
    schema = SCHEMAS[name].model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://session-store.invalid/schemas/{name}.json"
    return schema
