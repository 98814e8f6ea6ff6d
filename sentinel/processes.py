"""Starting, watching and stopping local processes: the one place that does it.

The job supervisor's local gang, the reference trainer's launcher, the simulated fleet, the
burn-in simulation, the demo and the Slurm test cluster all start processes with their output
in a log file, wait for them to answer, and end them with SIGTERM, a grace period, then SIGKILL.

Standard library only, on purpose: the reference trainer's launcher (`trainer_hooks.reference`)
imports it, and a training process takes nothing heavier from `sentinel` than the wire
protocol (a test checks what this module pulls in).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol


class Process(Protocol):
    """What ending a process needs: `subprocess.Popen`, or a rank forked from this process."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now, for a server this process starts next."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_rendezvous_port(low: int = 20000, high: int = 32000) -> int:
    """A port free right now, below Linux's ephemeral range (32768+), where outgoing
    connections would otherwise grab it between this check and the rank-0 store binding it."""
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {low}-{high} for the gang's rendezvous")


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    append: bool = True,
    new_session: bool = False,
    stdin: int | IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` with stdout and stderr in `log` (appended, or truncated first), or this
    process's own when `log` is None. `new_session`: the process leads a process group of its
    own, so that `stop(..., group=True)` ends its children too."""
    if log is None:
        return subprocess.Popen(
            list(argv), env=None if env is None else dict(env), stdin=stdin,
            start_new_session=new_session,
        )  # fmt: skip
    with log.open("ab" if append else "wb") as out:
        return subprocess.Popen(
            list(argv), env=None if env is None else dict(env), stdin=stdin, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=new_session,
        )  # fmt: skip


def _signal(proc: Process, sig: int, group: bool) -> None:
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)


def stop(procs: Sequence[Process], grace_s: float, *, group: bool = False) -> list[int | None]:
    """SIGTERM to every process still running, then wait up to `grace_s` for each in turn, and
    SIGKILL one still running after that. `group`: signal each one's process group (a process
    started with `new_session`). Returns the exit codes (-N: ended by signal N)."""
    for proc in procs:
        if proc.poll() is None:
            _signal(proc, signal.SIGTERM, group)
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=grace_s))
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL, group)
            codes.append(proc.wait())
    return codes


def stop_process(proc: Process | None, grace_s: float, *, group: bool = False) -> int | None:
    """`stop` for one process; None when there is none."""
    return None if proc is None else stop([proc], grace_s, group=group)[0]


def wait_ready(
    ready: Callable[[], bool],
    proc: Process | None,
    *,
    what: str,
    log: Path,
    timeout_s: float,
    deadline: float | None = None,
) -> None:
    """Poll `ready()` every 0.1 s until it is true. A process that exits first raises
    RuntimeError with the end of its log; past `deadline` (monotonic; default `timeout_s` from
    now) TimeoutError."""
    if deadline is None:
        deadline = time.monotonic() + timeout_s
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready in {timeout_s}s")
        time.sleep(0.1)


def first_failure(procs: Sequence[Process], timeout_s: float) -> int:
    """Watch a gang: the first non-zero exit code as soon as one rank fails (the others would
    wait forever on it), 0 when every one exited 0, 124 past `timeout_s`. Stops nothing."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c is not None and c != 0]
        if failed or all(c == 0 for c in codes):
            return failed[0] if failed else 0
        if time.monotonic() > deadline:
            return 124
        time.sleep(0.1)
