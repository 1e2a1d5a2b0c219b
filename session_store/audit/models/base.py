"""What every output model shares: no extra fields, checked on the way out (`dump`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


def dump(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """`data` checked against its model and returned as JSON types: an output that does not
    fit its published schema is a bug here, never sent."""
    return model.model_validate(data).model_dump(mode="json")


def iso_times(d: dict[str, Any]) -> dict[str, Any]:
    """`*_at_us`, `start_us`, `end_us` -> ISO `*_at`, `start`, `end`."""
    from ..fmt import iso

    out = {}
    for k, v in d.items():
        if k.endswith("at_us") or k in ("start_us", "end_us"):
            out[k[:-3]] = iso(v)
        else:
            out[k] = v
    return out
