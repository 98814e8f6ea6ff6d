"""torchft's lighthouse as a process of its own: where a job's data-parallel replicas meet.

The lighthouse forms each step's quorum from the replicas' heartbeats (torchft's `Manager` in
every rank). `sentinel run` starts one for a job whose replicas are fault domains
(`supervisor.replicas`), the tests and benchmarks start their own. Its settings here are
Sentinel's, not torchft's defaults (5 s and 60 s), because Sentinel ends a lost replica's
processes at once: a replica whose heartbeats stopped for `heartbeat_timeout_ms` leaves the
next quorum, so a kill costs its peers about that long; `join_timeout_ms` is how long a quorum
waits for a replica that still heartbeats but has not asked (a stuck device, when nobody ends
it). Standard library only: the reference trainer's test launcher uses it too.

`last_quorum` reads the lighthouse's own status page: the supervisor asks it which replicas
have trained at their peers' step since they rejoined (a replica still healing holds nothing).
`asking` reads there how many replicas wait for the next quorum: after it has ended every
replica, the supervisor launches the next ones once none of the ended ones still counts.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sentinel.processes import free_rendezvous_port, spawn, stop_process, wait_ready

SETTINGS: dict[str, int] = {
    "min_replicas": 1,
    "heartbeat_timeout_ms": 1000,
    "join_timeout_ms": 5000,
    "quorum_tick_ms": 50,
}


# The status page's last quorum (torchft 0.2's template): its id, then per member its replica id
# (the trainer's `replica-R`, torchft's `:uuid` after it) and the step it asked at.
_QUORUM_ID = re.compile(r"Previous quorum id:\s*(\d+)")
_MEMBER = re.compile(r"<b>replica-(\d+)(?::[^<]*)?</b>\s*<br/>\s*Step:\s*(-?\d+)")
# The next quorum's status: the replicas that asked for it and still heartbeat, of those asked.
_ASKING = re.compile(r"\[(\d+)/\d+ participants healthy\]")


@dataclass(frozen=True)
class QuorumView:
    """The last quorum the lighthouse formed: its id and the step each member replica asked
    at (torchft keeps the id while the members stay the same)."""

    quorum_id: int
    steps: dict[int, int]

    def at_peers_step(self, replica: int) -> bool:
        """The replica trained into this quorum at the step of the others: it holds the model.
        A replica healing in it asked at a step behind theirs (a new one at -1)."""
        step = self.steps.get(replica)
        return step is not None and step >= 0 and step == max(self.steps.values())


def parse_status(page: str) -> QuorumView | None:
    """The last quorum from the lighthouse's status page; None when it shows none."""
    found = _QUORUM_ID.search(page)
    if found is None:
        return None
    steps = {int(r): int(step) for r, step in _MEMBER.findall(page[found.end() :])}
    return QuorumView(int(found.group(1)), steps) if steps else None


class Lighthouse:
    """`torchft_lighthouse` (installed beside `python`) on a free port; `address` is what the
    replicas get as TORCHFT_LIGHTHOUSE."""

    def __init__(
        self, log: Path, advertise: str = "127.0.0.1", python: str = sys.executable, **flags: int
    ) -> None:
        self.port = port = free_rendezvous_port()
        self.address = f"http://{advertise}:{port}"
        settings = SETTINGS | flags
        # How long a replica whose processes ended may still be put in a quorum: its last ask
        # for one stays, and counts while its last heartbeat is younger than this.
        self.forgets_s = settings["heartbeat_timeout_ms"] / 1000
        argv = [str(Path(python).parent / "torchft_lighthouse"), "--bind", f"[::]:{port}"]
        for key, value in settings.items():
            argv += [f"--{key}", str(value)]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = spawn(argv, env={**os.environ, "RUST_LOG": "warn"}, log=log)
        wait_ready(lambda: _accepts(port), self.proc, what="lighthouse", log=log, timeout_s=60)

    def last_quorum(self, timeout_s: float = 2.0) -> QuorumView | None:
        """The lighthouse's last quorum; None when it has formed none or did not answer."""
        page = self._status(timeout_s)
        return None if page is None else parse_status(page)

    def asking(self, timeout_s: float = 2.0) -> int | None:
        """How many replicas have asked for the next quorum and still count (their last
        heartbeat younger than the timeout); None when it did not answer."""
        page = self._status(timeout_s)
        found = None if page is None else _ASKING.search(page)
        return None if found is None else int(found.group(1))

    def _status(self, timeout_s: float) -> str | None:
        url = f"http://127.0.0.1:{self.port}/status"  # it binds every address, run here
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as reply:
                return reply.read().decode("utf-8", "replace")
        except OSError:
            return None

    def close(self) -> None:
        stop_process(self.proc, 5.0)


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False
