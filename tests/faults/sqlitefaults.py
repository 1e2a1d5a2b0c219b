"""Real write failures under a SQLite database, for a test process that runs as root.

`chmod` cannot make a file unwritable for root (CAP_DAC_OVERRIDE), and it only affects
later open() calls anyway: the store's writer keeps its file descriptors. Two mechanisms act
on writes through descriptors that are already open, as a real failing disk does:

- Disk full: the database lives on a small tmpfs of its own; filling it with another file
  makes the kernel answer ENOSPC (SQLite: SQLITE_FULL). Deleting that file lifts it. Needs
  permission to mount (root with CAP_SYS_ADMIN, as on the CI machine).
- Unwritable: the immutable attribute (`chattr +i`, ext2/3/4 and others) on the database
  file, its WAL and its directory: every write, even through an open descriptor and even by
  root, fails with EPERM (SQLite: SQLITE_IOERR_WRITE), and the file cannot be reopened for
  writing (SQLite then opens it read-only: SQLITE_READONLY). `chattr -i` lifts it. The
  shared-memory index (-shm) is left alone: it is mapped into memory, and a write fault on
  an immutable mapping would be a SIGBUS, not an error SQLite can report.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path


class CannotFault(Exception):
    """This machine does not let the test create the fault (it says why)."""


class TinyDisk:
    """A tmpfs of `size_mb` at `path`; `fill()` makes it full, `free()` empties the filler."""

    def __init__(self, path: Path, size_mb: int = 64):
        self.path, self.size_mb = path, size_mb
        self.filler = path / "filler.bin"
        self.mounted = False

    def __enter__(self) -> TinyDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755",
                               "tmpfs", str(self.path)], capture_output=True, text=True)
        if done.returncode != 0:
            raise CannotFault(f"cannot mount a small tmpfs to fill up: {done.stderr.strip()}")
        self.mounted = True
        return self

    def fill(self) -> int:
        """Write until the kernel says ENOSPC; returns the bytes it took."""
        written = 0
        chunk = b"\0" * (1 << 16)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    # Partial blocks: write single bytes until not even one fits.
                    if len(chunk) == 1:
                        return written
                    chunk = b"\0"
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def full(self):
        """The disk is full while inside."""
        self.fill()
        try:
            yield
        finally:
            self.free()

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    def __exit__(self, *exc) -> None:
        self.free()
        if self.mounted:
            # Lazy: a connection that is still closing must not make the cleanup fail.
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def _chattr(flag: str, paths: list[Path]) -> None:
    done = subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, text=True)
    if done.returncode != 0:
        raise CannotFault(f"chattr {flag} failed: {done.stderr.strip() or done.stdout.strip()}")


def check_immutable_works(directory: Path) -> None:
    """Raise CannotFault unless `chattr +i` stops a write through an open descriptor here."""
    probe = directory / "immutable-probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            _chattr("+i", [probe])
        except FileNotFoundError as exc:
            raise CannotFault("chattr is not installed (e2fsprogs)") from exc
        try:
            os.pwrite(fd, b"x", 0)
        except PermissionError:
            return
        finally:
            _chattr("-i", [probe])
        raise CannotFault(f"the filesystem of {directory} does not enforce the immutable "
                          "attribute on open files")
    finally:
        os.close(fd)
        probe.unlink()


class Unwritable:
    """`with Unwritable(db_path):` the database, its WAL and its directory are immutable."""

    def __init__(self, db_path: Path):
        self.paths = [p for p in (db_path, Path(f"{db_path}-wal"), db_path.parent) if p.exists()]

    def __enter__(self) -> Unwritable:
        _chattr("+i", self.paths)
        return self

    def __exit__(self, *exc) -> None:
        _chattr("-i", self.paths)
