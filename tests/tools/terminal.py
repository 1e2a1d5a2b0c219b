"""Run a `session-store` command with its stdout on a real pseudo-terminal (so the command
sees a terminal of COLUMNS columns, as on a support engineer's screen), in this process."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import sys
import threading

from session_store.commands.cli import app

# What rich itself writes on a terminal: colours and styles (SGR), nothing else.
SGR = re.compile(r"\x1b\[[0-9;]*m")


def in_terminal(args: list[str], columns: int, monkeypatch) -> tuple[int, str]:
    """(exit code, what the terminal received, SGR codes left in) of `session-store ARGS`
    with stdout on a pty; stderr is left alone."""
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.delenv("NO_COLOR", raising=False)
    master, slave = pty.openpty()
    received: list[bytes] = []

    def drain():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            received.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out = os.fdopen(slave, "w", encoding="utf-8", closefd=False)
    old = sys.stdout
    sys.stdout = out
    try:
        try:
            code = app(args=args, standalone_mode=False)
        except SystemExit as exc:
            code = exc.code
        out.flush()
    finally:
        sys.stdout = old
        out.close()
        os.close(slave)
    reader.join(10)
    with contextlib.suppress(OSError):
        os.close(master)
    text = b"".join(received).decode("utf-8", "replace").replace("\r\n", "\n")
    return (code or 0), text


def plain(text: str) -> str:
    """The terminal's text without the styles rich added."""
    return SGR.sub("", text)
