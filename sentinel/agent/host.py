"""Host statistics through psutil: CPU, memory, disk, network, load."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

import psutil

# Pseudo and container filesystems say nothing about the node's disks.
_SKIP_FSTYPES = frozenset({"tmpfs", "devtmpfs", "overlay", "squashfs", "proc", "sysfs", "nsfs"})


@dataclass(frozen=True, slots=True)
class HostStats:
    cpu_utilization: float  # 0..1 over all cores since the previous reading
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int
    load1: float
    load5: float
    load15: float
    disks: dict[str, tuple[int, int]] = field(default_factory=dict)  # mount -> (used, total)
    net: dict[str, tuple[int, int]] = field(default_factory=dict)  # iface -> (rx, tx) bytes


class HostSource(Protocol):
    def read(self) -> HostStats: ...


class PsutilHost:
    """Reads the real host. Disks are listed once at start: mounts rarely change on a GPU node."""

    def __init__(self) -> None:
        psutil.cpu_percent(None)  # prime: the first call has no previous interval to compare to
        self._cpus = psutil.cpu_count() or 1  # fixed while the agent runs; ~80 us a call
        self._mounts = [
            p.mountpoint for p in psutil.disk_partitions(all=False) if p.fstype not in _SKIP_FSTYPES
        ] or ["/"]

    def read(self) -> HostStats:
        mem = psutil.virtual_memory()
        load1, load5, load15 = os.getloadavg()
        disks = {}
        for mount in self._mounts:
            try:
                usage = psutil.disk_usage(mount)
            except OSError:
                continue  # unmounted since start: skip this field, keep the rest
            disks[mount] = (usage.used, usage.total)
        net = {
            iface: (c.bytes_recv, c.bytes_sent)
            for iface, c in psutil.net_io_counters(pernic=True).items()
            if iface != "lo"
        }
        return HostStats(
            cpu_utilization=psutil.cpu_percent(None) / 100.0,
            cpu_count=self._cpus,
            memory_used_bytes=mem.total - mem.available,
            memory_total_bytes=mem.total,
            load1=load1,
            load5=load5,
            load15=load15,
            disks=disks,
            net=net,
        )
