"""A SQLite writer process that dies right after its first commit, before it answers: run by
tests/store/test_sqlite_writer_process.py as the store's writer (`WriterProcess.child_module`).

It dies once per marker file (SESSION_STORE_TEST_DIE_ONCE): the writer that replaces it is
this module again and must commit normally."""

from __future__ import annotations

import os

from session_store.storage import sqlite_writer

_commit_batch = sqlite_writer.commit_batch


def _commit_then_die(conn, st, batch, cached, on_planned=None):
    plan = _commit_batch(conn, st, batch, cached, on_planned)
    marker = os.environ["SESSION_STORE_TEST_DIE_ONCE"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(9)  # committed (durable), never answered
    return plan


if __name__ == "__main__":
    sqlite_writer.commit_batch = _commit_then_die
    sqlite_writer.main()
