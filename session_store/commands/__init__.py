"""The `session-store` commands, one module per group; `session_store.commands.cli` is the entry."""
