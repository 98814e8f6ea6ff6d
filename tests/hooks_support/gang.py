"""Launch a gang of worker ranks as real processes, and a small agent socket that records them."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sentinel.agent.ranks.registry import is_registration, parse_registration
from sentinel.processes import free_port
from sentinel.protocol import Command, Event, RankRegistration, decode_batch, encode

WORKER = Path(__file__).with_name("worker.py")
ROOT = Path(__file__).resolve().parents[2]


def launch(
    world: int, args: list[str], env: dict[str, str] | None = None, one_core: bool = False
) -> list[subprocess.Popen]:
    """`one_core`: every rank on the last core, for tests that compare the ranks' speed. The
    ranks are simulated devices that must be alike but for a fault, and each of these VMs' vCPUs
    changes speed on its own (see tests/hooks_support/straggler_runs.py)."""
    port = free_port()
    core = max(os.sched_getaffinity(0))
    procs = []
    for rank in range(world):
        e = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "SENTINEL_JOB": "testjob",
            "SENTINEL_NODE": f"node-{rank // 2}",
            **(env or {}),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), *args],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=(lambda: os.sched_setaffinity(0, {core})) if one_core else None,
            )
        )
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float = 120) -> list[str]:
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(out)
        assert p.returncode == 0, out
    return outs


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.communicate(timeout=30)


class FakeAgent:
    """A Unix-socket server speaking the agent's rank protocol: batches in, commands out."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[Event] = []
        self.lines = 0
        self.registrations: list[RankRegistration] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(64)
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if is_registration(line):  # a rank naming its GPU, as the real agent reads
                        with self._lock:
                            self.registrations.append(parse_registration(line))
                        continue
                    batch = decode_batch(line)
                    with self._lock:
                        self.lines += 1
                        self.events.extend(batch.events)

    def broadcast(self, cmd: Command) -> int:
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.sendall((encode(cmd) + "\n").encode())
        return len(conns)

    def of_kind(self, kind: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.kind == kind]

    def payloads(self, kind: str) -> list[tuple[int | None, Any]]:
        """(rank, payload model) of each event of `kind`."""
        return [(e.source.rank, e.payload) for e in self.of_kind(kind)]

    def close(self) -> None:
        self._stop = True
        self._server.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.close()


@contextlib.contextmanager
def fake_agent(tmp: Path) -> Iterator[FakeAgent]:
    agent = FakeAgent(tmp / "agent.sock")
    try:
        yield agent
    finally:
        agent.close()


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
