"""PostgreSQL's own behaviour (its writer connections, NOTIFY, tailing readers behind open
transactions, URL options): every test here runs on PostgreSQL only."""

from __future__ import annotations

import pytest

from ...conftest import empty_database


@pytest.fixture(params=["postgres"])
async def backend(request, tmp_path):
    async with empty_database(request.param, tmp_path) as database:
        yield database
