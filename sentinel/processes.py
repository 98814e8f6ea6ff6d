"""Starting, watching and stopping local processes: the one place that does it.

The job supervisor's local gang, the reference trainer's launcher, the simulated fleet, the
burn-in simulation, the demo and the Slurm test cluster all start processes with their output
in a log file, wait for them to answer, and end them with SIGTERM, a grace period, then SIGKILL.

Standard library only, on purpose: the reference trainer's launcher (`trainer_hooks.reference`)
imports it, and a training process takes nothing heavier from `sentinel` than the wire
protocol (a test checks what this module pulls in).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
            list(argv),
            env=None if env is None else dict(env),
            stdin=stdin,
            start_new_session=new_session,
        )
    with log.open("ab" if append else "wb") as out:
        return subprocess.Popen(
            list(argv),
            env=None if env is None else dict(env),
            stdin=stdin,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )


def fork_child(body: Callable[[], int | None]) -> int:
    """Fork; the child runs `body` and ends with its exit code (`os._exit`: nothing of the
    parent's runs in it again), 1 when it raised (the traceback printed). Returns the child's
    pid, in the parent."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code: int | None = 1
    try:
        code = body()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


def redirect_output(log: Path) -> None:
    """Point this process's fds 1 and 2, and Python's streams, at `log` (appended)."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _signal(proc: Process, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: nothing to signal
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


@dataclass(frozen=True)
class Teardown:
    """How a teardown went: every process it covered (the given ones and their descendants,
    by pid), which ended within the grace period, which needed SIGKILL, and which were still
    there at the end (a process in uninterruptible sleep: in the kernel, holding a device)."""

    pids: list[int]
    killed: list[int]
    survivors: list[int]
    seconds: float  # from the first signal until the last process was gone (or the give-up)
    codes: list[int | None]  # exit codes of the given processes (-N: ended by signal N)
    # Indices of the given processes that had ended before the first signal: their codes are
    # their own, not the teardown's (a rank that crashed just as its gang was being stopped).
    ended_before: tuple[int, ...] = ()
    # Processes that outlived the stop on purpose: warm ranks that left the generation and wait
    # for the next one (`sentinel.supervisor.warm`).
    kept: tuple[int, ...] = ()

    @property
    def verified(self) -> bool:
        return not self.survivors

    def as_json(self) -> dict[str, object]:
        return {
            "processes": len(self.pids),
            "killed": self.killed,
            "kept": list(self.kept),
            "survivors": self.survivors,
            "seconds": round(self.seconds, 3),
            "verified": self.verified,
        }


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) from /proc/PID/stat; None when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # the name may hold spaces and parentheses
    return int(fields[1]), fields[0].decode(), int(fields[19])


def descendants(pids: Sequence[int]) -> dict[int, int]:
    """{pid: start time} of every process below `pids` in the process tree now, whatever its
    session or group (a rank's helper that called setsid escapes a group signal)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := proc_stat(int(entry))) is not None:
            children.setdefault(st[0], []).append(int(entry))
            starts[int(entry)] = st[2]
    found: dict[int, int] = {}
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = starts[child]
                todo.append(child)
    return found


def alive(pid: int, start: int) -> bool:
    """The same process (pid and start time: pids are reused) is there and is no zombie."""
    st = proc_stat(pid)
    return st is not None and st[2] == start and st[1] not in ("Z", "X")


def teardown(
    procs: Sequence[Process],
    grace_s: float,
    *,
    group: bool = False,
    kill_wait_s: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
) -> Teardown:
    """End `procs` and everything below them, bounded: SIGTERM to all, one grace period for
    all together (not one each), SIGKILL to whatever is left, then verify that none survived.

    `group`: signal each one's process group too (a process started with `new_session`). The
    tree is read before the first signal and again before SIGKILL, so a helper started during
    the grace period is killed too; the whole teardown takes at most grace_s + kill_wait_s."""
    t0 = clock()
    own = {p.pid: p for p in procs}
    tree = {pid: st[2] for pid in own if (st := proc_stat(pid)) is not None}
    tree |= descendants(list(own))
    ended_before = []
    for i, proc in enumerate(procs):
        if proc.poll() is None:
            _signal(proc, signal.SIGTERM, group)
        else:
            ended_before.append(i)
    _signal_pids(tree, own, signal.SIGTERM)
    live = _wait_gone(own, tree, t0 + grace_s, clock)
    killed: list[int] = []
    if live:
        tree |= descendants(list(live))
        live |= {pid for pid, start in tree.items() if alive(pid, start)}
        for pid in own.keys() & live:
            _signal(own[pid], signal.SIGKILL, group)
        _signal_pids({p: tree[p] for p in live if p in tree}, own, signal.SIGKILL)
        killed = sorted(live)
        live = _wait_gone(own, tree, clock() + kill_wait_s, clock)
    codes = [p.poll() for p in procs]
    return Teardown(
        sorted(tree.keys() | own.keys()),
        killed,
        sorted(live),
        clock() - t0,
        codes,
        tuple(ended_before),
    )


def _signal_pids(tree: dict[int, int], own: dict[int, Process], sig: int) -> None:
    """`sig` to the descendants still there (the given processes are signalled on their own)."""
    for pid, start in tree.items():
        if pid not in own and alive(pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _wait_gone(
    own: dict[int, Process], tree: dict[int, int], until: float, clock: Callable[[], float]
) -> set[int]:
    """Poll (reaping the given processes) until none of the tree is alive or `until`; the pids
    still alive then."""
    while True:
        live = {pid for pid, p in own.items() if p.poll() is None}
        live |= {pid for pid, start in tree.items() if pid not in own and alive(pid, start)}
        if not live or clock() >= until:
            return live
        time.sleep(0.05)


def stop(procs: Sequence[Process], grace_s: float, *, group: bool = False) -> list[int | None]:
    """SIGTERM to every process still running, one grace period of `grace_s` for all of them,
    then SIGKILL to those still running (`teardown`). `group`: signal each one's process group
    (a process started with `new_session`). Returns the exit codes (-N: ended by signal N)."""
    return teardown(procs, grace_s, group=group).codes


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
