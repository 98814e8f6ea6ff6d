"""Running a command the way a person at a terminal does: on a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_pty(
    argv: list[str], timeout_s: float = 240, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal; everything it drew, and its exit code."""
    master, slave = pty.openpty()
    env = {**(os.environ if env is None else env), "COLUMNS": "120", "LINES": "40"}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(
        argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env, cwd=ROOT
    )
    os.close(slave)
    out, deadline = bytearray(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end closed: the process is done
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    if proc.poll() is None and time.monotonic() >= deadline:
        proc.kill()  # past its time: it must not outlive the test
    code = proc.wait(timeout=60)
    return code, out.decode(errors="replace")
