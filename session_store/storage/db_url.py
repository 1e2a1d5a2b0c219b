"""What `--db` (and $SESSION_STORE_URL) takes, made the URL the store opens.

A plain path (`a.db`, `/tmp/a.db`, `~/calls.db`) is a SQLite file; `sqlite:///…`,
`postgresql://…` and `postgres://…` (what other tools print) get the async drivers the store
runs on; `sqlite+aiosqlite://…` and `postgresql+asyncpg://…` are taken as they are. Anything
else is refused here, saying what is taken. The store then checks the rest (`check_url`: a
port, the driver's options; the SQLite file itself when it opens it).
"""

from __future__ import annotations

import os

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from . import URL_HINT

#: The schemes taken, and the driver each one runs on.
DRIVERS = {"sqlite": "sqlite+aiosqlite", "sqlite+aiosqlite": "sqlite+aiosqlite",
           "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg",
           "postgresql+asyncpg": "postgresql+asyncpg"}


def resolve_db(text: str) -> str:
    """The store's URL for a `--db` value; ValueError if it is neither a path nor a URL the
    store runs on. The message never quotes the value: it may hold a password."""
    if not text.strip():
        raise ValueError(f"--db is empty: give a SQLite file's path, or a URL ({URL_HINT})")
    if text == ":memory:":  # (SQLite's name: refused as such by the store and migrate)
        return "sqlite+aiosqlite:///:memory:"
    if "://" not in text:
        path = os.path.abspath(os.path.expanduser(text))
        # (URL.create: a path with '?' or '#' is still one path, not a query.)
        return URL.create("sqlite+aiosqlite", database=path).render_as_string()
    try:
        parsed = make_url(text)
    except (ArgumentError, ValueError):
        raise ValueError(f"the database URL cannot be parsed: {URL_HINT}") from None
    driver = DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ValueError(f"unsupported database URL scheme {parsed.drivername!r}: give a "
                         f"SQLite file's path, sqlite:///path.db or postgresql://user@host/db")
    if driver == parsed.drivername:
        return text
    return parsed.set(drivername=driver).render_as_string(hide_password=False)
