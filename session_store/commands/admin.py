"""Setting a database up and describing the outputs: `migrate`, `schema`."""

from __future__ import annotations

import inspect
import json
import os
from typing import Optional

import typer

from .common import (
    DbOption, SchemaOption, UserError, fail, print_json, run, say, show, url_of,
)


def migrate(db: Optional[str] = DbOption, schema: Optional[str] = SchemaOption) -> None:
    """Create or upgrade the schema (alembic upgrade head)."""
    from ..storage.migrate import upgrade

    async def go():
        url = url_of(db)
        try:
            await upgrade(url, schema=schema)
        except ValueError as exc:  # a bad --schema: one line, not a traceback
            raise UserError(str(exc)) from None
        return url

    url = run(go)
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    # (Which file: a relative path is the working directory's.)
    where = (f" in {os.path.abspath(parsed.database)}"
             if parsed.drivername.startswith("sqlite") and parsed.database else "")
    say(f"schema is at head{where}")



def schema_cmd(name: Optional[str] = typer.Argument(None, help="An output's name (none: "
                                                    "list them)."),
               write: Optional[str] = typer.Option(None, "--write", help="Write every "
                                                   "schema into this directory "
                                                   "(NAME.json).")) -> None:
    """The JSON Schema of a JSON output (call-page, timeline, state, export-line, …)."""
    from pathlib import Path

    from ..audit.models import SCHEMAS, schema_of

    if write is not None:
        folder = Path(write)
        folder.mkdir(parents=True, exist_ok=True)
        for n in SCHEMAS:
            (folder / f"{n}.json").write_text(json.dumps(schema_of(n), indent=2) + "\n")
        say(f"wrote {len(SCHEMAS)} schemas to {folder}")
        return
    if name is None:  # each description whole (its first paragraph), wrapped in its cell
        from ..audit.text import schemas_table

        show(schemas_table({n: " ".join(inspect.cleandoc(m.__doc__ or "").split("\n\n")[0]
                                         .split()) for n, m in SCHEMAS.items()}))
        return
    try:
        print_json(schema_of(name))
    except KeyError:
        fail(f"no schema {name!r}; one of {', '.join(SCHEMAS)}")
