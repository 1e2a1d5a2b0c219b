"""The `session-store` commands, one module per group; `session_store.cli` is the entry."""
