"""Network namespaces on a bridge: the "hosts" of a Slurm cluster on one machine.

Each cluster claims its own /24 inside 198.19.0.0/16 (half of 198.18.0.0/15, the block reserved
for network benchmarking) through an exclusive lock file, and names every interface and
namespace after a random tag, so that clusters started at the same time on one machine never
share a name or an address. Every namespace's interface is called `eth0`, so a rank sets
`GLOO_SOCKET_IFNAME=eth0` whichever node it runs on.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

CLAIMS = Path("/run/sentinel-slurm")
IFACE = "eth0"


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _subnets_in_use() -> set[int]:
    """Third octets of 198.19.X.0/24 addresses already on this machine's interfaces."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    used = set()
    for field in out.split():
        if field.startswith("198.19."):
            used.add(int(field.split(".")[2]))
    return used


def claim_subnet(tag: str) -> int:
    """A free 198.19.X.0/24, held by `CLAIMS/net-X` (our pid inside) until `release_subnet`.
    A claim whose process is gone is stale and taken over."""
    CLAIMS.mkdir(parents=True, exist_ok=True)
    used = _subnets_in_use()
    start = int(tag[:2], 16)
    for k in range(256):
        octet = (start + k) % 256
        if octet in used:
            continue
        lock = CLAIMS / f"net-{octet}"
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = int(lock.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # being written right now
            if _pid_alive(owner):
                continue
            lock.unlink(missing_ok=True)  # stale: its cluster died without tearing down
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {tag}\n")
        return octet
    raise RuntimeError("no free /24 left in 198.19.0.0/16 for a cluster network")


def release_subnet(octet: int) -> None:
    (CLAIMS / f"net-{octet}").unlink(missing_ok=True)


@dataclass(frozen=True)
class Host:
    """One node: a network namespace with `eth0` on the bridge, and its address."""

    name: str
    netns: str
    veth: str  # the host-side end, enslaved to the bridge
    addr: str

    def enter(self) -> list[str]:
        """argv prefix that runs a command in this node's network namespace (mounts untouched:
        `ip netns exec` would remount /sys and hide the cgroup hierarchies)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}"]


class Bridge:
    """A bridge with the controller's address and one namespace per node."""

    def __init__(self, tag: str, names: list[str]) -> None:
        self.tag = tag
        self.name = f"slb{tag}"
        self.octet: int | None = None
        self.hosts: list[Host] = []
        self._names = names

    @property
    def addr(self) -> str:
        return f"198.19.{self.octet}.1"

    def up(self) -> None:
        self.octet = claim_subnet(self.tag)
        ip("link", "add", self.name, "type", "bridge")
        ip("addr", "add", f"{self.addr}/24", "dev", self.name)
        ip("link", "set", self.name, "up")
        for k, name in enumerate(self._names):
            host = Host(
                name, f"sln{self.tag}{k}", f"slh{self.tag}{k}", f"198.19.{self.octet}.{k + 2}"
            )
            self.hosts.append(host)  # before creating it: down() removes what exists
            ip("netns", "add", host.netns)
            ip("link", "add", host.veth, "type", "veth", "peer", "name", IFACE, "netns", host.netns)
            ip("link", "set", host.veth, "master", self.name, "up")
            ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", IFACE)
            ip("-n", host.netns, "link", "set", IFACE, "up")
            ip("-n", host.netns, "link", "set", "lo", "up")

    def kill_all(self) -> None:
        """SIGKILL whatever still runs in the namespaces (tasks a daemon left behind)."""
        for host in self.hosts:
            out = subprocess.run(
                ["ip", "netns", "pids", host.netns], capture_output=True, text=True
            ).stdout
            for pid in out.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)

    def down(self) -> None:
        self.kill_all()
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", host.veth], capture_output=True)
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)
        if self.octet is not None:
            release_subnet(self.octet)
            self.octet = None
        self.hosts = []
