"""SQLite: no (tx_order, position) index.

SQLite commits one writer at a time in position order (tx_order is always 0 there), so its
global order is the primary key's and read_all sorts by position alone. The index only
added a b-tree page to every commit: about a quarter of an append's time on a fast disk
(bench/append_floor.py). PostgreSQL keeps it: its tailing readers need that order.

Revision ID: 0002_sqlite_order_by_position
Revises: 0001_initial
Create Date: 2026-12-03
"""
from alembic import op

revision = "0002_sqlite_order_by_position"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

_INDEX = "ix_session_events_tx_order_position"


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.drop_index(_INDEX, table_name="session_events")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.create_index(_INDEX, "session_events", ["tx_order", "position"])
