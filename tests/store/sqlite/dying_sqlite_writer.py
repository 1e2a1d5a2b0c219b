"""A SQLite writer process that dies right after its first commit, before it answers: run by
tests/store/sqlite/test_sqlite_writer_process.py as the store's writer (`WriterProcess.child_module`).

It dies once per marker file (SESSION_STORE_TEST_DIE_ONCE): the writer that replaces it is
this module again and must commit normally."""

from __future__ import annotations

import os

from session_store.storage.sqlite import child as sqlite_writer

_commit_batch = sqlite_writer.commit_batch


def _commit_then_die(conn, st, batch, cached, on_planned=None):
    plan = _commit_batch(conn, st, batch, cached, on_planned)
    marker = os.environ["SESSION_STORE_TEST_DIE_ONCE"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        if os.environ.get("SESSION_STORE_TEST_THEN_ANOTHER_APPENDS"):
            _another_writer_appends(conn, {r.stream_id for r in batch})
        os._exit(9)  # committed (durable), never answered
    return plan


def _another_writer_appends(conn, stream_ids) -> None:
    """What another store (another process) may do before the retry: read the stream, see
    the commit whose answer is lost, and append after it."""
    from session_store.records import chain_hash

    data = '{"generation":0,"role":"assistant","text":"another writer"}'
    conn.execute("BEGIN IMMEDIATE")
    for sid in sorted(stream_ids):
        version, last_hash, at = conn.execute(
            "SELECT version, last_hash, updated_at_us FROM session_streams WHERE stream_id = ?",
            (sid,)).fetchone()
        h = chain_hash(last_hash, sid, version + 1, "conversation.message", 1, at + 1, data)
        conn.execute("INSERT INTO session_events (tx_order, stream_id, version, type, "
                     "schema_version, data, recorded_at_us, hash) VALUES (0, ?, ?, ?, 1, ?, "
                     "?, ?)", (sid, version + 1, "conversation.message", data, at + 1, h))
        conn.execute("UPDATE session_streams SET version = ?, last_hash = ?, updated_at_us = ? "
                     "WHERE stream_id = ?", (version + 1, h, at + 1, sid))
    conn.execute("COMMIT")


if __name__ == "__main__":
    sqlite_writer.commit_batch = _commit_then_die
    sqlite_writer.main()
