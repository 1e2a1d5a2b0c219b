"""A throwaway PostgreSQL cluster that a fault test may stop, crash and restart.

The shared cluster on 127.0.0.1:5432 serves every other test (and other engineers' runs):
restarting it would break them. This one lives in a temporary directory, listens on a free
port on 127.0.0.1 and is deleted afterwards. As root it runs as the `postgres` user (initdb
and postgres refuse to run as root).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

#: Where the PostgreSQL server binaries are looked for (override: SESSION_STORE_PG_BIN).
PG_BIN_GLOBS = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/*/bin")


def find_pg_bin() -> tuple[Path | None, str]:
    """The directory holding initdb and pg_ctl, or None and why not."""
    candidates = [os.environ["SESSION_STORE_PG_BIN"]] if os.environ.get("SESSION_STORE_PG_BIN") \
        else [d for g in PG_BIN_GLOBS for d in sorted(glob.glob(g), reverse=True)]
    needed = ("initdb", "pg_ctl", "postgres")
    found = next((Path(d) for d in candidates
                  if all(os.access(Path(d) / b, os.X_OK) for b in needed)), None)
    if found is None:
        return None, (f"no PostgreSQL server binaries (initdb, pg_ctl, postgres) in "
                      f"{candidates or list(PG_BIN_GLOBS)}")
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return None, "running as root and there is no `postgres` user to run initdb as"
        if shutil.which("runuser") is None:
            return None, "running as root and `runuser` is missing"
    return found, ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Outage:
    """One stop/start of the cluster, in time.monotonic() seconds."""
    mode: str
    stop_at: float
    down_at: float  # pg_ctl stop returned: the server is gone
    start_at: float  # pg_ctl start issued
    up_at: float  # accepting connections again

    @property
    def duration(self) -> float:
        return self.up_at - self.stop_at


@dataclass
class PrivateCluster:
    bindir: Path
    root: Path
    port: int = field(default_factory=free_port)
    outages: list[Outage] = field(default_factory=list)

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:1])} failed ({done.returncode}): "
                               f"{done.stdout}{done.stderr}\n{self.log_tail()}")
        return done

    def log_tail(self, lines: int = 30) -> str:
        log = self.root / "server.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) \
            if log.exists() else ""

    def init(self) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.datadir), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        # fsync stays on (the default): "acknowledged" must mean what it means in production.
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c max_connections=60 -c shared_buffers=32MB")
        self._run("pg_ctl", "-D", str(self.datadir), "-o", options, "-l",
                  str(self.root / "server.log"), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """`immediate` is a crash (no checkpoint; crash recovery on the next start), `fast`
        an orderly shutdown that aborts open transactions and disconnects every client."""
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop")

    async def restart(self, mode: str, down_for: float, on_down=None) -> Outage:
        """Stop the server (`mode`), keep it down for `down_for` seconds, start it again.
        `on_down()` is called as soon as the server is gone."""
        stop_at = time.monotonic()
        await asyncio.to_thread(self.stop, mode)
        down_at = time.monotonic()
        if on_down is not None:
            on_down()
        await asyncio.sleep(max(0.0, down_for - (down_at - stop_at)))
        start_at = time.monotonic()
        await asyncio.to_thread(self.start)
        outage = Outage(mode, stop_at, down_at, start_at, time.monotonic())
        self.outages.append(outage)
        return outage

    async def create_schema(self, name: str) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"CREATE SCHEMA {name}")
        finally:
            await conn.close()

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_private_cluster() -> PrivateCluster:
    bindir, why = find_pg_bin()
    if bindir is None:
        raise FileNotFoundError(why)
    # Under /tmp, not pytest's tmp_path: the `postgres` user must be able to enter it.
    cluster = PrivateCluster(bindir, Path(tempfile.mkdtemp(prefix="outage-pg-")))
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        cluster.destroy()
        raise
    return cluster
