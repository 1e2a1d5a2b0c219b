"""PostgreSQL over asyncpg: the store's dialect (dialect.py), its committer (committer.py),
its commit statements (statements.py) and its followers' LISTEN connection (listener.py)."""

from .dialect import PostgresDialect, check_schema_name, notify_channel, postgres_store

__all__ = ["PostgresDialect", "check_schema_name", "notify_channel", "postgres_store"]
