"""Every stored byte of a test database, and the spellings a secret could take in it.

SQLite: the raw bytes of the database file and of its -wal and -shm files (freed pages and
WAL frames included, so a value written and later overwritten still counts). PostgreSQL:
every column of every row of every table in the test's schema, as COPY prints it.
"""

from __future__ import annotations

import base64
import math
import sqlite3
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url


def spellings(secret: str) -> dict[str, bytes]:
    """The secret as stored verbatim, in hex, and in base64/urlsafe base64 at each of the
    three byte alignments it can have inside a longer encoded value (the characters that
    depend on the secret alone)."""
    raw = secret.encode()
    out = {"plain": raw, "hex": raw.hex().encode(), "HEX": raw.hex().upper().encode()}
    for pad in range(3):
        enc = base64.b64encode(b"\0" * pad + raw)
        core = enc[math.ceil(8 * pad / 6):(8 * (pad + len(raw))) // 6]
        out[f"base64+{pad}"] = core
        out[f"urlsafe+{pad}"] = core.replace(b"+", b"-").replace(b"/", b"_")
    return out


def find(blobs: dict[str, bytes], secret: str) -> list[str]:
    """Where (blob name, spelling) the secret occurs."""
    return [f"{name}: {how}" for name, blob in blobs.items()
            for how, needle in spellings(secret).items() if needle in blob]


def sqlite_files(url: str) -> dict[str, bytes]:
    path = Path(make_url(url).database)
    return {p.name: p.read_bytes() for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"))
            if p.exists()}


def sqlite_checkpoint(url: str) -> None:
    """Move every WAL frame into the database file (what a restart or backup would keep)."""
    conn = sqlite3.connect(make_url(url).database)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0, "the checkpoint could not finish"
    finally:
        conn.close()


async def postgres_tables(backend) -> dict[str, bytes]:
    """COPY of every table of the backend's schema (all columns, text format)."""
    url = make_url(backend.url)
    schema = backend.options["schema"]
    conn = await asyncpg.connect(host=url.host, port=url.port, user=url.username,
                                 password=url.password, database=url.database)
    try:
        names = [r[0] for r in await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 "
            "ORDER BY table_name", schema)]
        out = {}
        for name in names:
            chunks: list[bytes] = []

            async def sink(data: bytes, chunks=chunks) -> None:
                chunks.append(bytes(data))

            await conn.copy_from_table(name, schema_name=schema, output=sink)
            out[name] = b"".join(chunks)
        return out
    finally:
        await conn.close()


async def stored_bytes(backend) -> dict[str, bytes]:
    if backend.name == "sqlite":
        return sqlite_files(backend.url)
    return await postgres_tables(backend)
