"""Database URLs the store runs on: which driver, and options its driver would refuse deep
inside, said first (never quoting the URL: it may hold a password)."""

from __future__ import annotations

#: How to write a URL for each driver the store runs on (said when a URL is refused).
URL_HINT = "use sqlite+aiosqlite:///path.db or postgresql+asyncpg://user@host/db"


def check_url(url: str) -> str:
    """The driver named by a database URL, or ValueError if it cannot be parsed (a path
    without its scheme, a port that is not a number) or names a driver the store does not
    run on. The message never quotes the URL: it may hold a password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        # make_url takes any number as a port; the driver's connect() then fails deep
        # inside (asyncpg: OverflowError) instead of as bad input.
        if parsed.port is not None and not 0 < parsed.port < 65536:
            raise ValueError("port out of range")
        driver = parsed.drivername
    except (ArgumentError, ValueError):
        raise ValueError(f"the database URL cannot be parsed: {URL_HINT}") from None
    if driver not in ("sqlite+aiosqlite", "postgresql+asyncpg"):
        raise ValueError(f"unsupported database URL driver {driver!r}: {URL_HINT}")
    if driver == "postgresql+asyncpg":
        _check_asyncpg_options(parsed.query)
    return driver


#: URL options SQLAlchemy's asyncpg adaptor takes for itself; every other one goes to
#: asyncpg.connect (the writers and the listener pass them on as the pool does).
SQLALCHEMY_ONLY_OPTIONS = ("prepared_statement_cache_size", "prepared_statement_name_func",
                           "async_creator_fn")
# libpq's spellings people paste from other tools, and what asyncpg calls them.
_LIBPQ_SPELLINGS = {"sslmode": "ssl (e.g. ?ssl=require)", "dbname": "the path (/db)",
                    "connect_timeout": "the store's attempt_timeout option",
                    "application_name": "nothing: the store names its connections itself"}


def _check_asyncpg_options(query) -> None:
    """Refuse a URL option asyncpg.connect does not take: it fails every connect with a
    TypeError deep inside the driver. Names the option (never its value: it may be a
    password, as with `?password=`)."""
    import inspect

    import asyncpg

    taken = set(inspect.signature(asyncpg.connect).parameters) - {"dsn", "loop",
                                                                   "connection_class"}
    unknown = sorted(k for k in query if k not in taken and k not in SQLALCHEMY_ONLY_OPTIONS)
    if unknown:
        hints = "; ".join(f"for {k} use {_LIBPQ_SPELLINGS[k]}" for k in unknown
                          if k in _LIBPQ_SPELLINGS)
        raise ValueError(f"the database URL has options asyncpg does not take: "
                         f"{', '.join(unknown)}" + (f" ({hints})" if hints else ""))
