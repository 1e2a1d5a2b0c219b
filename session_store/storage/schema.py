"""The database schema as SQLAlchemy Core tables. Changed only through Alembic migrations.

`events` is the log: one row per event, `position` its global identity. `tx_order` makes
the global order safe for tailing readers on PostgreSQL without a table lock: it holds the
writing transaction's id (0 on SQLite, where one writer at a time commits in position
order). `streams` is each stream's head (version, last hash, fencing epoch) so an append
checks its expected version with one indexed row instead of scanning events.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import (BigInteger, Column, Index, Integer, MetaData, String, Table, Text,
                        UniqueConstraint)

from ..errors import SchemaMismatch

STREAM_ID_MAX = 255  # the stream_id columns' length


def valid_id(text: str | None, max_len: int = STREAM_ID_MAX) -> bool:
    """Could this string be stored at all (no NUL, no lone surrogate, not too long)?

    The same rule on both databases (PostgreSQL text cannot hold NUL; SQLite would take what
    PostgreSQL refuses): appends refuse such a stream id, readers answer "not found" without
    asking the database, which would reject it with a driver error.
    """
    if not isinstance(text, str) or "\x00" in text or len(text) > max_len:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def valid_stream_id(text: str | None) -> bool:
    """Could this be a stream (call) id: `valid_id`, and not empty."""
    return bool(text) and valid_id(text)


def check_stream_id(stream_id: str) -> None:
    """ValueError unless `valid_stream_id`: the store's one rule for the ids it appends to
    and reads, on both databases (SQLite took an empty id, PostgreSQL refused a NUL with a
    driver error on every read)."""
    if not valid_stream_id(stream_id):
        raise ValueError(f"a stream id must be valid UTF-8 text of 1 to {STREAM_ID_MAX} "
                         f"characters without NUL, not {stream_id!r:.80}")


metadata = MetaData()

# SQLite needs exactly INTEGER PRIMARY KEY to make `position` the rowid (assigned in commit
# order by the single writer); PostgreSQL gets a 64-bit identity.
_position_type = BigInteger().with_variant(Integer(), "sqlite")


def _only_on(dialect_name: str, index: Index) -> Index:
    """An index created on one dialect only: SQLAlchemy's DDL skips it elsewhere, and
    `on_dialect` (Alembic's comparison) reads the same mark."""
    index.info["only_on"] = dialect_name
    return index.ddl_if(dialect=dialect_name)

streams = Table(
    "session_streams", metadata,
    Column("stream_id", String(STREAM_ID_MAX), primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("last_hash", String(64), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("created_at_us", BigInteger, nullable=False),
    Column("updated_at_us", BigInteger, nullable=False),
    # The call list reads heads newest first, a page at a time (migration 0003).
    Index("ix_session_streams_created_at_us_stream_id", "created_at_us", "stream_id"),
)

events = Table(
    "session_events", metadata,
    Column("position", _position_type, primary_key=True, autoincrement=True),
    Column("tx_order", BigInteger, nullable=False),
    Column("stream_id", String(STREAM_ID_MAX), nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("type", String(100), nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("data", Text, nullable=False),
    Column("recorded_at_us", BigInteger, nullable=False),
    Column("hash", String(64), nullable=False),
    UniqueConstraint("stream_id", "version", name="uq_session_events_stream_version"),
    # PostgreSQL's global order for tailing readers. SQLite's is the primary key (one writer
    # commits in position order, tx_order 0): there this index only cost a quarter of every
    # commit (bench/append_floor.py), and migration 0002 drops it.
    _only_on("postgresql", Index("ix_session_events_tx_order_position", "tx_order", "position")),
)

snapshots = Table(
    "session_snapshots", metadata,
    Column("stream_id", String(STREAM_ID_MAX), primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("projection_version", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("created_at_us", BigInteger, nullable=False),
)

# Alembic revisions this code knows, oldest first; the last is the one it runs on.
# tests/store/contract/test_migrations.py checks this list against migrations/versions.
KNOWN_REVISIONS: tuple[str, ...] = ("0001_initial", "0002_sqlite_order_by_position",
                                     "0003_streams_by_start")
HEAD_REVISION = KNOWN_REVISIONS[-1]


def on_dialect(dialect_name: str):
    """Alembic's `include_object` for one dialect: leaves out what the tables declare for
    another one only (`info["only_on"]`), so autogenerate compares what migrations create."""
    def include(obj, name, type_, reflected, compare_to) -> bool:
        only_on = getattr(obj, "info", {}).get("only_on")
        return only_on is None or only_on == dialect_name
    return include


def check_known_revisions(found: Iterable[str]) -> None:
    """SchemaMismatch if the database is at a revision this code does not know: it was
    migrated by newer code, which this code must not downgrade or run on. (The wording of
    the store's own check, storage/store.py `_check_schema`.)"""
    found = list(found)
    if any(r not in KNOWN_REVISIONS for r in found):
        raise SchemaMismatch(
            f"the database schema is at revision {found or 'none'}, which this code does not know "
            f"(it runs on {HEAD_REVISION}); it was migrated by newer code: upgrade this code, "
            "do not downgrade the database under a newer deployment")


def unrecorded_revision(matches: bool | None = None) -> str:
    """What to say of a database with the session store's tables and no recorded revision
    (alembic_version missing or emptied): `migrate` must not create the tables over them.
    `matches`: whether they are this code's schema (migrate compares), None if unknown."""
    stamp = ("`alembic -c alembic.ini -x url=URL [-x schema=NAME] stamp "
             f"{HEAD_REVISION}` (from the project's checkout), then run `session-store migrate`")
    if matches is None:
        then = (f"if they are this code's schema (revision {HEAD_REVISION}; `session-store "
                f"migrate` says), record it with {stamp}")
    elif matches:
        then = f"they are this code's schema (revision {HEAD_REVISION}): record it with {stamp}"
    else:
        then = ("they are not this code's schema either (an older or edited one): restore "
                "alembic_version from a backup, or stamp the revision they are at")
    return ("the database has session store tables but no recorded schema revision (the "
            "alembic_version table is missing or empty), so which migrations it has is "
            f"unknown and migrate will not create the tables over them; {then}")
