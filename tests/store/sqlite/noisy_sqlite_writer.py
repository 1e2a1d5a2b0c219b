"""A SQLite writer process that prints to its stdout while it starts and works, as a
sitecustomize, a library's warning or a stray debug print would: run by
tests/store/sqlite/test_sqlite_writer_process.py as the store's writer. None of it may reach the
protocol."""

from __future__ import annotations

import sys

from session_store.storage.sqlite import child as sqlite_writer

_commit_batch = sqlite_writer.commit_batch


def _noisy_commit(*args, **kwargs):
    print("\x00\x00\x10\x00 not a frame", flush=True)
    sys.stdout.buffer.write(b"\x80\x05garbage")
    sys.stdout.flush()
    return _commit_batch(*args, **kwargs)


if __name__ == "__main__":
    print("starting the writer", flush=True)
    sqlite_writer.commit_batch = _noisy_commit
    sqlite_writer.main()
