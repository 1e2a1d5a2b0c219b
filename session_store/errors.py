"""Errors the store and the core raise. Each one says what happened and what to do."""

from __future__ import annotations


class SessionStoreError(Exception):
    """Base class of every error this package raises on purpose."""


class ConcurrencyConflict(SessionStoreError):
    """The stream's version moved since the caller read it (optimistic concurrency)."""

    def __init__(self, stream_id: str, expected: int, actual: int | None):
        self.stream_id, self.expected, self.actual = stream_id, expected, actual
        super().__init__(
            f"stream {stream_id!r}: expected version {expected}, but it is at {actual}; "
            "re-read the stream and decide again"
        )

    def __reduce__(self):  # picklable: the SQLite writer process returns it as an outcome
        return (self.__class__, (self.stream_id, self.expected, self.actual))


class Fenced(ConcurrencyConflict):
    """A newer worker took the stream over (I6): this worker must stop writing to it."""

    def __init__(self, stream_id: str, epoch: int | None, current_epoch: int):
        self.epoch, self.current_epoch = epoch, current_epoch
        if epoch is None:  # (an append that passed none, after a takeover: batch.py)
            message = (f"stream {stream_id!r}: an append without an epoch is fenced off by "
                       f"epoch {current_epoch} (the call was taken over): pass the writer's "
                       "epoch, or unfenced=True to append whichever worker owns the call")
        else:
            message = (f"stream {stream_id!r}: writer epoch {epoch} is fenced off by epoch "
                       f"{current_epoch} (another worker took this call over)")
        SessionStoreError.__init__(self, message)
        self.stream_id, self.expected, self.actual = stream_id, -1, None

    def __reduce__(self):
        return (self.__class__, (self.stream_id, self.epoch, self.current_epoch))


class CallClosed(SessionStoreError):
    """The call's log says it ended: a worker does not take it over (nor open a session)."""

    def __init__(self, stream_id: str, version: int):
        self.stream_id, self.version = stream_id, version
        super().__init__(f"call {stream_id!r} ended (session.closed, at or before version "
                         f"{version}): nothing to take over; give a new call a new id")

    def __reduce__(self):  # picklable: a takeover's outcome, from the SQLite writer process
        return (self.__class__, (self.stream_id, self.version))


class EventDecodeError(SessionStoreError):
    """A stored event cannot be turned back into a typed event. Never skipped silently."""

    def __init__(self, message: str, *, stream_id: str | None = None, version: int | None = None,
                 position: int | None = None, event_type: str | None = None):
        self.stream_id, self.version, self.position, self.event_type = (
            stream_id, version, position, event_type)
        where = f"event {stream_id}@{version} (position {position}, type {event_type!r})"
        super().__init__(f"{where}: {message}")


class UnknownEventType(EventDecodeError):
    """The log holds an event type this code does not know (written by newer code?)."""


class SchemaVersionTooNew(EventDecodeError):
    """The event was written with a newer schema version of its type than this code knows."""


class CorruptEvent(EventDecodeError):
    """The row's payload is not valid JSON or does not fit its type."""


class StreamDamaged(SessionStoreError, ValueError):
    """The stored stream contradicts itself: a version is missing or out of order, or the
    stream's head row disagrees with its rows (rows deleted, reordered, or written behind
    the log's back). Acting on what is left would act on a partial call: refuse, and say
    to run `session-store verify`. (A ValueError too: the fold raised that before.)"""

    def __init__(self, message: str, *, stream_id: str | None = None,
                 version: int | None = None):
        self.stream_id, self.version = stream_id, version
        at = f" at version {version}" if version is not None else ""
        super().__init__(f"stream {stream_id!r} is damaged{at}: {message}; "
                         "run `session-store verify` on it")


class CannotOpen(SessionStoreError):
    """The URL leads to something that is not a usable database (no such database or role,
    a refused login, a file that is not SQLite). Not an outage: waiting will not fix it."""


def driver_said(exc: BaseException) -> str:
    """The first line of what the database driver said (SQLAlchemy wraps it in `orig`)."""
    return (str(getattr(exc, "orig", None) or exc).splitlines() or [""])[0]


def refused(exc: BaseException) -> CannotOpen:
    """CannotOpen for a database that was reached and refused: says what the database said,
    never the URL (it may hold a password)."""
    return CannotOpen(f"the database refused to be used as a session store ({driver_said(exc)}); "
                      "check the URL (database, user, password, file)")


class SchemaMismatch(SessionStoreError):
    """The database schema is missing, older or newer than this code's migrations."""


class StoreClosed(SessionStoreError):
    """The store was closed; nothing more can be appended or read."""


class StoreUnavailable(SessionStoreError):
    """The database did not take an append within its bounded wait (down, unreachable, disk
    full, read-only). The append was not acknowledged; it is in the log only if the
    connection broke in the middle of its commit, so re-read the stream before appending
    again. The message says what the database reported."""


class StoreFilesChanged(StoreUnavailable):
    """SQLite: the database file or its write-ahead log was removed, replaced or truncated
    while the store had them open. Commits since the last checkpoint may be lost with them,
    and nothing written there now would be read again, so the store takes no more appends
    (each one raises this, unacknowledged). Close it, and check the database (`session-store
    verify`, a backup) before opening it again."""
