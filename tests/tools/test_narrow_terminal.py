"""Issue #35 item 3: at 80 columns `calls`, `timeline`, `state`, `stats` and `schema` fit the
terminal for a call id of 36 characters (a UUID's length); only cells of words wrap, between
words, and ids stay whole."""

from __future__ import annotations

import asyncio

import pytest

from .helpers import support_call, write_call
from .terminal import in_terminal, plain

CALL = "call-3f9c2a7e-5b1d-4c8e-9a6f-2d7b8e1c0a55"  # 41 characters


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_every_view_fits_80_columns(migrated, monkeypatch):
    await write_call(migrated, CALL, support_call())
    for args in (["calls"], ["timeline", CALL], ["state", CALL], ["state", CALL, "--at", "13"],
                 ["stats", "--since", "3000d"], ["schema"]):
        extra = [] if args[0] == "schema" else migrated.cli_args
        code, text = await asyncio.to_thread(in_terminal, args + extra, 80, monkeypatch)
        assert code == 0, (args, text)
        lines = plain(text).splitlines()
        assert max(len(line.rstrip()) for line in lines) <= 80, (args, plain(text))
        if args[0] != "schema" and args[0] != "stats":
            assert CALL in plain(text), args  # whole, on one line
    code, text = await asyncio.to_thread(in_terminal, ["timeline", CALL] + migrated.cli_args,
                                         80, monkeypatch)
    shown = plain(text)
    for word in ("tool_response", "lookup_order", "deferred", "completed"):
        assert word in shown, word  # wrapped between words, never inside one
