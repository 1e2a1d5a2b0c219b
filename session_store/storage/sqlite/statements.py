"""The SQL of a SQLite commit, compiled once from the Core tables (`schema.py`).

The store compiles it and hands it to whatever commits (`commit.py`, in the writer process or
inline), which runs without SQLAlchemy.
"""

from __future__ import annotations

from sqlalchemy import bindparam, func, literal_column, select, update
from sqlalchemy.dialects import sqlite as sqlite_dialect

from ..schema import events, streams
from .commit import APPEND_COLUMNS, APPEND_VIEW, HEAD_MOVED, Statements, bound_parameter_limit


def _sql(stmt) -> str:
    return str(stmt.compile(dialect=sqlite_dialect.dialect(paramstyle="qmark")))


# Rows that fit one statement's bound parameters; a bigger batch takes the transactional path.
_MAX_ROWS_PER_STATEMENT = bound_parameter_limit() // len(APPEND_COLUMNS)


# The one-statement append: a batch planned from cached heads is one INSERT into this
# temporary view, whose INSTEAD OF trigger checks each event against its stream's head row
# (version, last hash, epoch: the conditional update of the transactional path) and writes
# both; a head that moved aborts the statement, and nothing is written. One statement is one
# transaction from the write lock to the fsync in one sqlite3 call (on the loop's thread,
# inline, one call instead of four). Temporary objects live in the connection: no migration
# (as the PostgreSQL writer's temporary function).
_CREATE_APPEND_VIEW = (f"CREATE TEMP VIEW IF NOT EXISTS {APPEND_VIEW} AS SELECT "
                       + ", ".join(f"NULL AS {c}" for c in APPEND_COLUMNS))
_CREATE_APPEND_TRIGGER = f"""
CREATE TEMP TRIGGER IF NOT EXISTS {APPEND_VIEW}_insert INSTEAD OF INSERT ON {APPEND_VIEW}
BEGIN
    SELECT RAISE(ABORT, '{HEAD_MOVED}') WHERE NOT EXISTS (
        SELECT 1 FROM {streams.name} WHERE stream_id = NEW.stream_id
        AND version = NEW.version - 1 AND last_hash = NEW.prev_hash
        AND epoch = NEW.expect_epoch);
    UPDATE {streams.name} SET version = NEW.version, last_hash = NEW.hash, epoch = NEW.epoch,
        updated_at_us = NEW.recorded_at_us WHERE stream_id = NEW.stream_id;
    INSERT INTO {events.name} (tx_order, stream_id, version, type, schema_version, data,
                               recorded_at_us, hash)
    VALUES (0, NEW.stream_id, NEW.version, NEW.type, NEW.schema_version, NEW.data,
            NEW.recorded_at_us, NEW.hash);
END"""
# One statement for all the batch's stream heads.
SELECT_HEADS = (f"SELECT stream_id, version, last_hash, epoch FROM {streams.name} "
                 "WHERE stream_id IN ({marks})")


def compile_statements() -> Statements:
    """The commit's SQL, compiled from the Core tables."""
    return Statements(
        select_heads=SELECT_HEADS,
        select_hash=_sql(select(events.c.hash).where(events.c.stream_id == bindparam("s"),
                                                     events.c.version == bindparam("v"))),
        select_closed=_sql(select(func.min(events.c.version)).where(
            events.c.stream_id == bindparam("s"), events.c.version > bindparam("v"),
            events.c.type == bindparam("t"))),
        append_view=(_CREATE_APPEND_VIEW, _CREATE_APPEND_TRIGGER),
        insert_stream=_sql(streams.insert().values(
            stream_id=bindparam("s"), version=bindparam("v"), last_hash=bindparam("h"),
            epoch=bindparam("e"), created_at_us=bindparam("t"), updated_at_us=bindparam("t2"))),
        # Conditional: the row must still hold the head the batch was planned from (a cached
        # head another store moved updates nothing, and the batch is planned again).
        update_stream=_sql(update(streams).where(
            streams.c.stream_id == bindparam("s"), streams.c.version == bindparam("ov"),
            streams.c.last_hash == bindparam("oh"), streams.c.epoch == bindparam("oe")).values(
            version=bindparam("v"), last_hash=bindparam("h"), epoch=bindparam("e"),
            updated_at_us=bindparam("t"))),
        insert_event=_sql(events.insert().values(
            tx_order=literal_column("0"), stream_id=bindparam("s"), version=bindparam("v"),
            type=bindparam("ty"), schema_version=bindparam("sv"), data=bindparam("d"),
            recorded_at_us=bindparam("t"), hash=bindparam("h"))),
        max_rows_per_statement=_MAX_ROWS_PER_STATEMENT)
