"""Run Alembic programmatically (the CLI's `migrate`, tests, the demo)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

ALEMBIC_INI = Path(__file__).resolve().parent.parent / "alembic.ini"


def alembic_config(url: str, schema: str | None = None) -> Config:
    if not ALEMBIC_INI.exists():
        raise FileNotFoundError(f"{ALEMBIC_INI} not found: install the project from its checkout "
                                "(pip install -e .) so the migrations are available")
    cfg = Config(str(ALEMBIC_INI))
    cfg.attributes["url"] = url
    if schema:
        cfg.attributes["schema"] = schema
    return cfg




async def upgrade(url: str, revision: str = "head", *, schema: str | None = None) -> None:
    # Alembic's env.py runs its own event loop: keep it off ours.
    await asyncio.to_thread(command.upgrade, alembic_config(url, schema), revision)


async def downgrade(url: str, revision: str = "base", *, schema: str | None = None) -> None:
    await asyncio.to_thread(command.downgrade, alembic_config(url, schema), revision)
