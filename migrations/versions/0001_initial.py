"""The event log, stream heads and projection snapshots.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_streams",
        sa.Column("stream_id", sa.String(255), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.Column("updated_at_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "session_events",
        sa.Column("position", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  primary_key=True, autoincrement=True),
        sa.Column("tx_order", sa.BigInteger, nullable=False),
        sa.Column("stream_id", sa.String(255), nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("recorded_at_us", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.UniqueConstraint("stream_id", "version", name="uq_session_events_stream_version"),
    )
    op.create_index("ix_session_events_tx_order_position", "session_events",
                    ["tx_order", "position"])
    op.create_table(
        "session_snapshots",
        sa.Column("stream_id", sa.String(255), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("projection_version", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("session_snapshots")
    op.drop_index("ix_session_events_tx_order_position", table_name="session_events")
    op.drop_table("session_events")
    op.drop_table("session_streams")
