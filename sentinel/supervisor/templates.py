"""The local launcher's side of `sentinel.ranks.template`: a template process that forks the
simulated fleet's node hosts, and the hosts it forked, as processes this one can end."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel.processes import alive, proc_stat

# How long a request to fork a host may wait for its answer: the first waits for the template's
# import of the trainer (torch: seconds, longer on a busy machine).
TEMPLATE_ANSWER_S = 120.0


@dataclass
class ForkedHost:
    """A node host forked by a template, not by this process: alive or not by /proc, its pid
    with its start time (pids are reused). Its exit code is the template's to collect; `poll`
    says only that it ended (0)."""

    pid: int
    start: int | None

    @classmethod
    def of(cls, pid: int) -> ForkedHost:
        stat = proc_stat(pid)
        return cls(pid, stat[2] if stat is not None else None)

    def poll(self) -> int | None:
        return None if self.start is not None and alive(self.pid, self.start) else 0

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        return 0

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class Template:
    """`python -m sentinel.ranks.template` (argv), its requests on its stdin, its answers read
    with a deadline: a template that hangs in its import fails the hosts it was asked for, as a
    host that never comes does."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path | None) -> None:
        with open(log or os.devnull, "ab") as err:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        self._pending = b""

    @property
    def gone(self) -> bool:
        return self.proc.poll() is not None

    def fork(self, request: dict[str, Any], timeout_s: float) -> int | None:
        """The pid of the host forked for `request`; None when the template is gone or did not
        answer within `timeout_s`."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            return None
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return int(json.loads(line)["pid"])

    def close(self, grace_s: float) -> None:
        """Its stdin closed: it kills the hosts it forked and ends; killed if it does not."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
