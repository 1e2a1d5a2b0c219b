"""SQLite's own behaviour (its writer process, inline commits, the one-statement commit, WAL
checkpoints): every test here runs on SQLite only."""

from __future__ import annotations

import pytest

from ...conftest import empty_database


@pytest.fixture(params=["sqlite"])
async def backend(request, tmp_path):
    async with empty_database(request.param, tmp_path) as database:
        yield database
