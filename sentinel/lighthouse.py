"""torchft's lighthouse as a process of its own: where a job's data-parallel replicas meet.

The lighthouse forms each step's quorum from the replicas' heartbeats (torchft's `Manager` in
every rank). `sentinel run` starts one for a job whose replicas are fault domains
(`supervisor.replicas`), the tests and benchmarks start their own. Its settings here are
Sentinel's, not torchft's defaults (5 s and 60 s), because Sentinel ends a lost replica's
processes at once: a replica whose heartbeats stopped for `heartbeat_timeout_ms` leaves the
next quorum, so a kill costs its peers about that long; `join_timeout_ms` is how long a quorum
waits for a replica that still heartbeats but has not asked (a stuck device, when nobody ends
it). Standard library only: the reference trainer's test launcher uses it too.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from pathlib import Path

from sentinel.processes import free_rendezvous_port, spawn, stop_process, wait_ready

SETTINGS: dict[str, int] = {
    "min_replicas": 1,
    "heartbeat_timeout_ms": 1000,
    "join_timeout_ms": 5000,
    "quorum_tick_ms": 50,
}


class Lighthouse:
    """`torchft_lighthouse` (installed beside `python`) on a free port; `address` is what the
    replicas get as TORCHFT_LIGHTHOUSE."""

    def __init__(
        self, log: Path, advertise: str = "127.0.0.1", python: str = sys.executable, **flags: int
    ) -> None:
        port = free_rendezvous_port()
        self.address = f"http://{advertise}:{port}"
        argv = [str(Path(python).parent / "torchft_lighthouse"), "--bind", f"[::]:{port}"]
        for key, value in (SETTINGS | flags).items():
            argv += [f"--{key}", str(value)]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = spawn(argv, env={**os.environ, "RUST_LOG": "warn"}, log=log)
        wait_ready(lambda: _accepts(port), self.proc, what="lighthouse", log=log, timeout_s=60)

    def close(self) -> None:
        stop_process(self.proc, 5.0)


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False
