"""The SQLite database file: the path a URL names, and what would keep a store from opening
or writing it, said before SQLite would only say "unable to open database file"."""

from __future__ import annotations

import os
import urllib.parse

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

from ...errors import CannotOpen, SchemaMismatch


def database_path(url) -> str:
    """The file a SQLite URL names; ValueError for none (in memory, or empty): durability and
    other processes need a file, and `migrate` would persist nothing."""
    parsed = make_url(url)
    path = parsed.database
    if not path or path == ":memory:" or parsed.query.get("mode") == "memory":
        raise ValueError("the SQLite store needs a database file (sqlite+aiosqlite:///path.db):"
                         " without a path, or in memory, nothing would persist, and no other "
                         "process could read it")
    return path


def check_database_file(path: str, *, creating: bool = False) -> None:
    """What SQLite would only call "unable to open database file" (or, for a store, a
    database without a schema), said first: a directory, a missing directory, a missing
    file (unless `creating`: migrate makes it)."""
    where = os.path.abspath(path)
    if os.path.isdir(where):
        raise CannotOpen(f"{where} is a directory, not a SQLite database file")
    if not os.path.isdir(os.path.dirname(where)):
        raise CannotOpen(f"the directory {os.path.dirname(where)} does not exist (for the "
                         f"SQLite database {where})")
    if not creating and not os.path.exists(where):
        raise SchemaMismatch(
            f"the database file {where} does not exist; to create a session store there, run "
            "`session-store migrate --db URL` (alembic upgrade head)")
    if not creating and _empty(where):
        # Not "no schema, run migrate": a store's file is never empty, so this one was
        # truncated or never was one, and migrate would write a new store over the evidence.
        raise CannotOpen(
            f"the database file {where} is empty (0 bytes, and no write-ahead log): it holds "
            "no session store. If it held calls, it was truncated: keep it as it is and "
            "restore the database from a backup; `migrate` would make a new, empty store of "
            "it")


def _empty(path: str) -> bool:
    try:
        if os.path.getsize(path) > 0:
            return False
    except OSError:
        return False
    try:  # (a database whose pages are all in its WAL yet)
        return os.path.getsize(path + "-wal") == 0
    except OSError:
        return True


def check_writable(path: str) -> None:
    """CannotOpen if SQLite cannot write the database here: the file is read-only, or its
    directory is and the -wal and -shm files SQLite needs are not there to reuse."""
    where = os.path.abspath(path)
    directory = os.path.dirname(where)
    if os.path.exists(where) and not os.access(where, os.W_OK):
        raise CannotOpen(cannot_write(where, "the file is read-only"))
    if not os.access(directory, os.W_OK) and not all(
            os.path.exists(where + suffix) for suffix in ("-wal", "-shm")):
        raise CannotOpen(cannot_write(where, f"its directory {directory} is read-only, and "
                                              "SQLite makes its -wal and -shm files there"))


def cannot_write(path: str, why: str) -> str:
    return (f"the SQLite database {os.path.abspath(path)} cannot be written ({why}): a store "
            "that appends must write it and its directory; tools that only read open it "
            "read_only")


def read_mode(path: str, read_only: bool) -> dict[str, str]:
    """The URI options of the read connections. A read-only store opens the file read-only;
    in a directory nobody can write, without a WAL file, it opens it immutable: SQLite
    could not create the -shm file it needs to read a WAL database there, and nobody can
    write it (they would need to create a WAL or a journal next to it) until a writer who
    may comes: `ReadConnections` then opens it again."""
    if not read_only:
        return {"mode": "rw", "uri": "true"}
    where = os.path.abspath(path)
    if not os.access(os.path.dirname(where), os.W_OK) and not os.path.exists(where + "-wal"):
        return {"mode": "ro", "immutable": "1", "uri": "true"}
    return {"mode": "ro", "uri": "true"}


class ReadConnections:
    """Each read connection's mode, decided when it opens (`read_mode`), and an immutable
    one replaced once the files changed under it.

    Immutable, SQLite reads the file as it was and never looks again: a reader that cannot
    write the directory (a viewer or `tail` as its own user) saw nothing written after it
    opened, and said nothing. So a connection opened immutable notes the files as they were;
    checked out after they changed (the writer came: a -wal is there; or wrote and left), it
    is dropped and a new one opened, plain read-only once the writer's -wal and -shm exist.
    """

    def __init__(self, path: str, read_only: bool):
        self._path, self._read_only = os.path.abspath(path), read_only

    def _files(self) -> tuple:
        try:
            st = os.stat(self._path)
        except OSError:
            return ()
        return (st.st_ino, st.st_size, st.st_mtime_ns, os.path.exists(self._path + "-wal"))

    def on_connect(self, _dialect, record, cargs, _cparams) -> None:
        """(SQLAlchemy's do_connect: `cargs[0]` is the URI the connection opens.)"""
        mode = read_mode(self._path, self._read_only)
        options = "&".join(f"{k}={v}" for k, v in mode.items() if k != "uri")
        cargs[0] = f"file:{urllib.parse.quote(self._path)}?{options}"
        record.info["immutable_files"] = self._files() if "immutable" in mode else None

    def on_checkout(self, _dbapi_connection, record, _proxy) -> None:
        seen = record.info.get("immutable_files")
        if seen is not None and self._files() != seen:
            raise DisconnectionError(f"{self._path} changed under a connection that reads it "
                                     "immutable: open it again")
