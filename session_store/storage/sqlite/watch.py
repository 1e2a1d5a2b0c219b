"""What a committing connection checks of its database's files' content, before it
acknowledges a commit: that nobody but SQLite wrote them.

A file emptied or overwritten in place keeps its inode, so the identity checks of
`CommitConnection` miss it: after `: > db-wal` SQLite goes on appending frames behind a
zeroed header (every later commit acknowledged, and unreadable once the process ends); after
`cp other.db db` it reads pages of another database. So, with a few preads of pages in the
cache (bench/append.py):

- the WAL agrees with the shared-memory index SQLite keeps of it: its header and its last
  committed frame carry the index's salts, that frame its running checksum, and the file is
  long enough to hold every frame the index counts;
- the database file (header, size, change and modification times) changed only when a
  checkpoint ran: one copies WAL frames into it, and announces itself in the index
  (`nBackfillAttempted`) before it writes a page. Across a checkpoint (or while one is
  unfinished) the header must be one a checkpoint could write (`_may_follow`);
- across a checkpoint of ours (`commit.checkpoint`, the only kind on the writer's
  connection), a few pages no frame of the WAL holds are as before it (`witness`): bytes
  written over the file as it runs are otherwise taken for its work, since it copies page
  1 back and truncates the file to its own size (seen once under load, 2026-12-06).

Checked without SQLite's locks: another process may be committing or restarting the WAL
meanwhile, which can make a snapshot disagree for a moment; a disagreement that persists
over a few fresh snapshots is not SQLite's. A change made while another process's
checkpoint runs can be missed: the checkpoint explains it; one that spares the few pages
witnessed while ours runs, too.
"""

from __future__ import annotations

import array
import os
import struct
import time

_WAL_MAGIC = (0x377F0682, 0x377F0683)
_WAL_HEADER = 32
_FRAME_HEADER = 24
# The WAL index (-shm): two copies of a 48-byte header, then the checkpoint information.
_INDEX_HEADER = struct.Struct("=IIIBBHIIII8sII")  # native byte order, as SQLite maps it
_INDEX_READ = 136
# Then the page number of each frame: the index is 32 KiB blocks, each 4096 page numbers
# and a hash table, the first block's list shortened by the header.
_INDEX_BLOCK = 32768
_PGNO_BLOCK = 4096
_PGNO_FIRST = _PGNO_BLOCK - _INDEX_READ // 4
_DB_HEADER = 100
_ATTEMPTS = 5  # fresh snapshots before a disagreement counts

# Descriptors this process opened on a database file or its index, by (device, inode).
# Closing any descriptor of a file drops every POSIX lock this process holds on it, SQLite
# connections' included (the SHARED lock that keeps another process from deleting the WAL):
# they stay open while any connection may be open here. The writer process, whose commit
# connection is the only one, closes them with it (`close_when_unused`).
_shared: dict[tuple[int, int], list[int]] = {}  # -> [fd, users]
close_when_unused = False


def _acquire(path: str) -> tuple[int, tuple[int, int]] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino)
    entry = _shared.get(key)
    if entry is not None:  # (never a second descriptor: it could only be closed again)
        entry[1] += 1
        return entry[0], key
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    st = os.fstat(fd)  # (what it opened, should the path have been replaced meanwhile)
    key = (st.st_dev, st.st_ino)
    if key in _shared:  # (replaced by a file already held: the rare case, keep this one)
        _shared[key][1] += 1
        return fd, key
    _shared[key] = [fd, 1]
    return fd, key


def _release(key: tuple[int, int] | None) -> None:
    if key is None:
        return
    entry = _shared.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0 and close_when_unused:
        del _shared[key]
        os.close(entry[0])


class Changed(Exception):
    """What changed (a phrase: "the write-ahead log X was emptied or overwritten")."""


class FileWatch:
    """The content checks of one connection's database files (`check`)."""

    def __init__(self, path: str):
        self.path, self.wal_path, self.shm_path = path, path + "-wal", path + "-shm"
        self._db = _acquire(path)
        self._shm: tuple[int, tuple[int, int]] | None = None
        self._wal_fd: int | None = None  # (SQLite locks no byte of the WAL: its own fd)
        self._wal_ino: int | None = None
        self._db_seen: tuple | None = None
        self._checkpoints: tuple | None = None
        self.frames = 0  # in the WAL, by its index at the last check (the writer's backstop)

    def close(self) -> None:
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None
        for held in (self._db, self._shm):
            if held is not None:
                _release(held[1])
        self._db = self._shm = None

    def check(self) -> None:
        """Changed if a file was written by anything but SQLite since the last check."""
        _persisting(self._check_once)

    def _index(self) -> tuple | str | None:
        """(salts, frame count, page size, checksum, checkpoint progress) of the WAL index;
        None without one; what is wrong with it (a str), as while a writer updates it."""
        if self._shm is None:
            self._shm = _acquire(self.shm_path)
            if self._shm is None:
                return None
        raw = os.pread(self._shm[0], _INDEX_READ, 0)
        if len(raw) < _INDEX_READ:
            return f"the shared-memory index {self.shm_path} was truncated ({len(raw)} bytes)"
        if raw[:48] != raw[48:96]:
            return f"the shared-memory index {self.shm_path} is being written"
        (_version, _unused, _change, init, _big_endian, page, frames, _pages, ck1, ck2,
         salts, _ck3, _ck4) = _INDEX_HEADER.unpack_from(raw, 0)
        if not init:
            return f"the shared-memory index {self.shm_path} is being written"
        (backfilled,), (attempted,) = struct.unpack_from("=I", raw, 96), \
            struct.unpack_from("=I", raw, 128)
        page = 65536 if page == 1 else page
        return salts, frames, page, (ck1, ck2), (salts, backfilled, attempted)

    def witness(self) -> tuple | None:
        """Before a checkpoint of ours: a few pages of the database file that it will not
        write (in no frame of the WAL), read now, to be compared after it (`check_witness`).
        Read before the check that precedes the checkpoint, which proves them ours. None if
        the index cannot be read."""
        if self._db is None:
            return None
        for attempt in range(_ATTEMPTS):
            index = self._index()
            if index is None or isinstance(index, tuple):
                break
            time.sleep(0.001 * attempt)
        if not isinstance(index, tuple):
            return None
        salts, frames, page, _checksum, _progress = index
        in_wal = self._wal_pages(1, frames)
        if in_wal is None:
            return None
        fd = self._db[0]
        last = os.fstat(fd).st_size // page
        # The first, the last and a middle page the log does not hold: a database written
        # over in place (`cp other.db db`) differs there, and the WAL's pages are restored.
        picked = set()
        for start, step in ((2, 1), (last, -1), (last // 2, 1)):
            p = start
            while 2 <= p <= last and p in in_wal:
                p += step
            if 2 <= p <= last:
                picked.add(p)
        return salts, frames, page, {p: os.pread(fd, page, (p - 1) * page) for p in picked}

    def check_witness(self, witness: tuple) -> None:
        """Changed if a page of `witness` changed though no checkpoint could write it: a
        checkpoint explains every change of the file's header, size and times, so one
        written over in place while ours ran looks like its work (its header, page 1, and
        its size are the checkpoint's again after it)."""
        _persisting(lambda: self._witness_changed(witness))

    def _witness_changed(self, witness: tuple) -> str | None:
        salts, frames, page, pages = witness
        index = self._index()
        if isinstance(index, str):
            return index
        if index is None or index[0] != salts or index[1] < frames or self._db is None:
            return None  # (the log restarted since: which pages went through it is gone)
        later = self._wal_pages(frames + 1, index[1])  # another process's commits since
        if later is None:
            return f"the shared-memory index {self.shm_path} was truncated"
        fd = self._db[0]
        for p, seen in pages.items():
            if p in later:
                continue
            now = os.pread(fd, page, (p - 1) * page)
            if now != seen:
                # Zeros: most likely a hole, the file cut short while the checkpoint ran and
                # written long again by it (its size and header then say nothing).
                how = "truncated or overwritten" if not now.strip(b"\0") else "overwritten"
                return (f"the database file {self.path} was {how} (its page {p} changed "
                        "during a checkpoint, which had no copy of it to write)")
        return None

    def _wal_pages(self, first: int, last: int) -> set[int] | None:
        """The page numbers of the WAL's frames `first`..`last` (from 1), by the index: the
        first of its 32 KiB blocks holds 4062 after the header, every later one 4096."""
        pages: set[int] = set()
        if self._shm is None:  # (read after the index, which opens it)
            return None
        while first <= last:
            if first <= _PGNO_FIRST:
                offset, end = _INDEX_READ + 4 * (first - 1), _PGNO_FIRST
            else:
                block = (first - _PGNO_FIRST - 1) // _PGNO_BLOCK + 1
                zero = _PGNO_FIRST + (block - 1) * _PGNO_BLOCK
                offset, end = block * _INDEX_BLOCK + 4 * (first - zero - 1), zero + _PGNO_BLOCK
            count = min(last, end) - first + 1
            raw = os.pread(self._shm[0], 4 * count, offset)
            if len(raw) < 4 * count:
                return None
            pages.update(array.array("I", raw))
            first += count
        return pages

    def _wal(self) -> int | None:
        try:
            st = os.stat(self.wal_path)
        except OSError:
            return None  # (the identity checks say it was removed)
        if self._wal_fd is None or st.st_ino != self._wal_ino:
            if self._wal_fd is not None:
                os.close(self._wal_fd)
            self._wal_fd = os.open(self.wal_path, os.O_RDONLY)
            self._wal_ino = os.fstat(self._wal_fd).st_ino
        return self._wal_fd

    def _check_once(self) -> str | None:
        index = self._index()
        if isinstance(index, str):
            return index
        checkpoints, self.frames = None, 0
        if index is not None:
            salts, frames, page, checksum, checkpoints = index
            self.frames = frames
            problem = self._check_wal(salts, frames, page, checksum)
            if problem is not None:
                return problem
        return self._check_db(checkpoints)

    def _check_wal(self, salts: bytes, frames: int, page: int, checksum) -> str | None:
        if frames == 0:
            return None  # (nothing in the WAL to lose; SQLite writes its header anew)
        fd = self._wal()
        if fd is None:
            return None
        what = f"the write-ahead log {self.wal_path} was emptied or overwritten"
        last = _WAL_HEADER + (frames - 1) * (page + _FRAME_HEADER)
        size = os.fstat(fd).st_size
        if size < last + _FRAME_HEADER + page:
            return f"{what} (it holds {size} bytes, its index counts {frames} frames)"
        header = os.pread(fd, _WAL_HEADER, 0)
        if struct.unpack_from(">I", header)[0] not in _WAL_MAGIC or header[16:24] != salts:
            return f"{what} (its header is not the one its index expects)"
        frame = os.pread(fd, _FRAME_HEADER, last)
        if frame[8:16] != salts or struct.unpack_from(">II", frame, 16) != checksum:
            return f"{what} (its frame {frames} is not the one its index expects)"
        return None

    def _check_db(self, checkpoints) -> str | None:
        if self._db is None:
            return None
        fd = self._db[0]
        st = os.fstat(fd)
        seen = (os.pread(fd, _DB_HEADER, 0), st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        before = self._db_seen
        if before is not None and seen != before:
            what = f"the database file {self.path} was overwritten"
            if checkpoints == self._checkpoints and _settled(checkpoints):
                if seen[:3] != before[:3]:
                    return (f"{what} (not by a checkpoint: its header, size or modification "
                            "time changed)")
            elif not _may_follow(before[0], seen[0]):
                return f"{what} (its header is not one a checkpoint could write)"
        # (Unchanged, changed by a checkpoint, or only its ctime: chmod, chown, a link.)
        self._db_seen, self._checkpoints = seen, checkpoints
        return None


def _persisting(problem_of) -> None:
    """Changed if `problem_of()` names a problem in each of a few fresh snapshots."""
    problem = None
    for attempt in range(_ATTEMPTS):
        problem = problem_of()
        if problem is None:
            return
        time.sleep(0.001 * attempt)
    raise Changed(problem)


def _settled(checkpoints) -> bool:
    """No checkpoint left unfinished? One that failed part-way (a full disk) has written
    pages; tried again at the same frame, it writes more without announcing itself anew."""
    return checkpoints is None or checkpoints[1] >= checkpoints[2]


def _may_follow(old: bytes, new: bytes) -> bool:
    """Can a checkpoint turn the database header `old` into `new`? It copies page 1 as a
    later transaction wrote it: the same format, page size and encoding (set once: 0 before
    the first table); its change counter and page count never go down (this store never
    vacuums)."""
    if len(new) < _DB_HEADER or new[:24] != old[:24]:
        return False
    settings = struct.Struct(">6I")  # schema format .. incremental vacuum (offsets 44-67)
    if any(o not in (0, n) for o, n in zip(settings.unpack_from(old, 44),
                                            settings.unpack_from(new, 44))):
        return False
    counter_old, pages_old = struct.unpack_from(">II", old, 24)
    counter_new, pages_new = struct.unpack_from(">II", new, 24)
    return counter_new >= counter_old and pages_new >= pages_old
