"""Which training rank owns which GPU: registrations on the agent's rank socket.

A rank announces itself with one JSON line on its connection:

    {"v": 1, "register": {"job": "llm-70b", "rank": 5, "gpu": 5, "pid": 4242,
                          "tp": 1, "pp": 0, "dp": 2}}

`gpu` is the NVML index of its device (or leave it out and give `pid`: the agent finds the GPU
whose NVML process list holds it). The registration lasts while the connection is open: a rank
that exits, crashes or closes the socket releases its GPU, so the job labels never outlive the
job. The agent exports one info series per owned GPU,
`sentinel_gpu_job_info{node, gpu, job, rank, tp, pp, dp} 1`, which queries join onto the GPU
series (see docs/agent.md for why an info series and not labels on every series).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sentinel.agent.nvml.readings import GpuReading
from sentinel.beacon import beacon_path
from sentinel.protocol import (
    SUPPORTED_VERSIONS,
    ProtocolError,
    RankRegistration,
    format_validation_error,
)

MAX_PER_CONNECTION = 16  # one process drives a handful of GPUs at most
MAX_REGISTRATIONS = 1024  # per node: bounds the info series whatever the ranks send


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    v: int
    registration: RankRegistration = Field(alias="register")  # `register` is a BaseModel method


def is_registration(line: bytes) -> bool:
    return b'"register"' in line and b'"kind"' not in line


def parse_registration(line: bytes) -> RankRegistration:
    """One registration line, or ProtocolError with the reason (for the rank's log)."""
    try:
        doc = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("v") not in SUPPORTED_VERSIONS:
        raise ProtocolError(
            f"unsupported or missing protocol version; supported: {sorted(SUPPORTED_VERSIONS)}"
        )
    try:
        return _Envelope.model_validate(doc).registration
    except ValidationError as e:
        raise ProtocolError(format_validation_error(e)) from None


@dataclass(frozen=True, slots=True)
class Owner:
    gpu: int
    reg: RankRegistration


@dataclass(frozen=True, slots=True)
class Peer:
    """The process at the other end of a rank connection, as the kernel gives it
    (SO_PEERCRED): what a registration claims about a process is checked against it."""

    pid: int
    uid: int


@dataclass(frozen=True, slots=True)
class Watched:
    """A registered rank whose beacon the agent watches (`watch.py`): its own process's."""

    reg: RankRegistration
    peer: Peer
    beacon: Path


class RankRegistry:
    def __init__(self) -> None:
        self._by_conn: dict[Hashable, list[RankRegistration]] = {}
        self._peers: dict[Hashable, Peer] = {}

    def register(
        self, conn: Hashable, reg: RankRegistration, peer: Peer | None = None
    ) -> str | None:
        """Record `reg` for the connection; returns why its beacon is not watched, if it
        named one the agent cannot take: only the registering process's own, at the path of
        the pid the kernel gives (a rank in another PID namespace goes unwatched)."""
        regs = self._by_conn.setdefault(conn, [])
        if len(regs) >= MAX_PER_CONNECTION or len(self) >= MAX_REGISTRATIONS:
            raise ProtocolError("too many rank registrations")
        if reg.gpu is None and reg.pid is None:
            raise ProtocolError("a registration names its gpu, its pid, or both")
        refused = None
        if reg.beacon is not None:
            if peer is not None and Path(reg.beacon) == beacon_path(peer.pid, reg.rank):
                self._peers[conn] = peer
            else:
                refused = (
                    f"beacon {reg.beacon} is not the connecting process's (pid {peer and peer.pid})"
                )
                reg = reg.model_copy(update={"beacon": None})
        regs[:] = [r for r in regs if (r.job, r.rank) != (reg.job, reg.rank)] + [reg]
        return refused

    def watched(self) -> Iterator[Watched]:
        """The registrations with a beacon, each with the process that registered it."""
        for conn, regs in self._by_conn.items():
            peer = self._peers.get(conn)
            for reg in regs:
                if peer is not None and reg.beacon is not None:
                    yield Watched(reg, peer, Path(reg.beacon))

    def release(self, conn: Hashable) -> None:
        self._by_conn.pop(conn, None)
        self._peers.pop(conn, None)

    def __len__(self) -> int:
        return sum(len(regs) for regs in self._by_conn.values())

    def owners(self, readings: Iterable[GpuReading]) -> Iterator[Owner]:
        """Registrations resolved to a GPU (by index, else by the pid NVML shows on it)."""
        by_pid = {p.pid: r.index for r in readings for p in r.processes}
        for regs in self._by_conn.values():
            for reg in regs:
                gpu = reg.gpu if reg.gpu is not None else by_pid.get(reg.pid or -1)
                if gpu is not None:
                    yield Owner(gpu, reg)

    def collect(self, node: str, readings: Iterable[GpuReading]) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            "sentinel_gpu_job_info",
            "1 while a training rank owns the GPU: its job, rank and parallel coordinates "
            "(join: * on (node, gpu) group_left (job, rank) sentinel_gpu_job_info).",
            labels=["node", "gpu", "job", "rank", "tp", "pp", "dp"],
        )
        seen: set[tuple[int, str, int]] = set()
        for o in sorted(self.owners(readings), key=lambda o: (o.gpu, o.reg.job, o.reg.rank)):
            r = o.reg
            if (o.gpu, r.job, r.rank) in seen:
                continue
            seen.add((o.gpu, r.job, r.rank))
            labels = [node, str(o.gpu), r.job, str(r.rank), str(r.tp), str(r.pp), str(r.dp)]
            fam.add_metric(labels, 1)
        yield fam
