"""Index the call heads by start time.

The call list's default order (newest first), its pages and its time filters read heads in
start order: without an index every listing sorted every head, so it cost what the store
holds rather than what its page holds (bench/listing.py). The start time never changes after
a call's first append, so the index costs one entry per call and no head update touches it.

Revision ID: 0003_streams_by_start
Revises: 0002_sqlite_order_by_position
Create Date: 2026-12-03
"""
from alembic import op

revision = "0003_streams_by_start"
down_revision = "0002_sqlite_order_by_position"
branch_labels = None
depends_on = None

_INDEX = "ix_session_streams_created_at_us_stream_id"


def upgrade() -> None:
    op.create_index(_INDEX, "session_streams", ["created_at_us", "stream_id"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="session_streams")
