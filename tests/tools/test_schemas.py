"""Every JSON output, CLI and web alike, validates against its published schema
(docs/schemas/NAME.json, generated from session_store/audit/models/), and the published
files are the models' schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from session_store.audit.models import SCHEMAS, schema_of

from .conftest import running_viewer, viewer_client
from .helpers import acli, cli

DOCS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def validator(name: str) -> Draft202012Validator:
    schema = json.loads((DOCS / f"{name}.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def valid(name: str, value) -> None:
    errors = sorted(validator(name).iter_errors(value), key=lambda e: list(e.path))
    assert not errors, f"{name}: " + "; ".join(f"{list(e.path)}: {e.message}"
                                               for e in errors[:5])


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_the_published_schemas_are_the_models(name):
    """docs/schemas is what `session-store schema NAME` prints (regenerate with
    `session-store schema --write docs/schemas`)."""
    assert json.loads((DOCS / f"{name}.json").read_text()) == schema_of(name)
    r = cli("schema", name)
    assert r.exit_code == 0 and json.loads(r.stdout) == schema_of(name)
    assert sorted(p.stem for p in DOCS.glob("*.json")) == sorted(SCHEMAS)


async def test_every_cli_json_output_fits_its_schema(loaded):
    async def out(*args):
        r = await acli(*args, backend=loaded)
        assert r.exit_code in (0, 1), (args, r.output)
        return r.stdout

    valid("call-page", json.loads(await out("calls", "--json")))
    valid("call-page", json.loads(await out("calls", "--json", "--text", "order",
                                            "--sort", "longest")))
    for call in ("support-1", "failing-1", "live-1"):
        valid("timeline", json.loads(await out("timeline", call, "--json")))
        valid("timeline", json.loads(await out("timeline", call, "--json", "--from", "2",
                                               "--limit", "3")))
        valid("state", json.loads(await out("state", call, "--json")))
        valid("state", json.loads(await out("state", call, "--json", "--at", "1",
                                            "--redact")))
        valid("replay", json.loads(await out("replay", call, "--json", "--defer", "none")))
        for line in (await out("export", call, "--redact")).splitlines():
            valid("export-line", json.loads(line))
    for line in (await out("tail", "support-1", "--json", "-n", "30")).splitlines():
        valid("export-line", json.loads(line))  # (a closed call: the tail ends)
    valid("verify", json.loads(await out("verify", "--json")))
    valid("verify", json.loads(await out("verify", "support-1", "--json")))
    valid("stats", json.loads(await out("stats", "--json", "--since", "3000d")))
    valid("stats", json.loads(await out("stats", "--json", "--since", "1h")))


async def test_every_web_json_answer_fits_its_schema(loaded):
    with running_viewer(loaded) as base:
        async with viewer_client(base) as http:
            async def get(path, **params):
                r = await http.get(path, params=params)
                return r.json()

            valid("call-page", await get("/api/calls"))
            valid("call-page", await get("/api/calls", status="closed", failed="1"))
            for call in ("support-1", "failing-1", "live-1"):
                valid("timeline", await get(f"/api/timeline/{call}"))
                valid("timeline", await get(f"/api/timeline/{call}", **{"from": 2, "n": 2}))
                valid("state", await get(f"/api/state/{call}", at=1, redact="1"))
                valid("state", await get(f"/api/state/{call}"))
                valid("replay", await get(f"/api/replay/{call}"))
                export = await http.get(f"/export/{call}")
                for line in export.text.splitlines():
                    valid("export-line", json.loads(line))
            valid("stats", await get("/api/stats", since="3000d"))
            for path in ("/api/timeline/nope", "/api/nothing-here", "/api/calls?after=nope"):
                valid("error", (await http.get(path)).json())
            async with http.stream("GET", "/api/live/support-1") as stream:
                data = [line[5:].strip() async for line in stream.aiter_lines()
                        if line.startswith("data:")]
            assert data, "the live stream of a closed call says so once, then ends"
            for d in data:
                valid("live-update", json.loads(d))
