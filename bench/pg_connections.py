"""How many TCP connections a process holds to PostgreSQL (port 5432 unless told): its
sockets (/proc/PID/fd) matched with the kernel's table of TCP connections. Linux only; used by
bench/live_clients.py and tests/tools/test_follow_scaling.py. Not a benchmark itself."""

from __future__ import annotations

import os
from pathlib import Path

ESTABLISHED = "01"


def pg_connections(pid: int | None = None, port: int = 5432) -> int:
    """Established connections from process `pid` (default: this one) to `port`."""
    pid = pid or os.getpid()
    sockets = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # (closed meanwhile)
        if target.startswith("socket:["):
            sockets.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == ESTABLISHED and fields[9] in sockets:
                count += 1
    return count
