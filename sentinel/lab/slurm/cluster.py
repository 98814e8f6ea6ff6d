"""A real Slurm cluster on one machine: `slurmctld` on the host, one `slurmd` per node.

Each node is a network namespace on a private bridge with its own address and, through
`unshare --uts`, its own hostname; the controller listens on the bridge. As on a real cluster,
the nodes' names resolve on every node: each node's processes see the cluster's hosts file
(the machine's, plus a line per node) bind-mounted over /etc/hosts in a mount namespace of
their own (`unshare --mount`), so the machine's own /etc/hosts is never touched. The cluster has its
own `munged` (own key and socket), its own ports and its own state directory, so several can
run side by side. `stop()` (also run at exit) cancels the jobs, stops every daemon, kills what
is left in the namespaces and removes the namespaces, the bridge and the directory.

Used by the tests, `sentinel demo --fleet slurm` and `benchmarks/slurm.py`:

    with SlurmCluster(["node-0", "node-1", "spare-0"]) as cluster:
        cluster.run(["srun", "-N3", "hostname"])
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sentinel.lab.slurm.network import IFACE, Bridge, Host
from sentinel.processes import free_port, spawn, stop_process

DAEMONS = ("slurmctld", "slurmd", "munged", "nsenter", "unshare", "ip")


def missing_requirements() -> str | None:
    """Why a cluster cannot start on this machine, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces, slurmd) on Linux"
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install slurm-wlm munge iproute2)"
    return None


@dataclass
class NodeState:
    state: str  # sinfo's long state: idle, allocated, drained, draining, down, ...
    reason: str


@dataclass
class SlurmCluster:
    nodes: list[str]
    cpus: int = 2
    prolog: Path | None = None  # slurm.conf Prolog= (run by slurmd on each node, as root)
    extra_conf: list[str] = field(default_factory=list)  # more slurm.conf lines
    workdir: Path | None = None  # default: a fresh temporary directory, removed at stop
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])

    def __post_init__(self) -> None:
        self.bridge = Bridge(self.tag, self.nodes)
        self._own_workdir = self.workdir is None
        self.dir = Path(self.workdir or tempfile.mkdtemp(prefix=f"slurm-{self.tag}-"))
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._started = False

    # --- what callers use --------------------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def controller_addr(self) -> str:
        """The host's address on the cluster network (where a coordinator on the host is
        reached from the nodes)."""
        return self.bridge.addr

    @property
    def iface(self) -> str:
        return IFACE

    def env(self) -> dict[str, str]:
        """The environment Slurm's commands need to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def host(self, node: str) -> Host:
        return next(h for h in self.bridge.hosts if h.name == node)

    @property
    def hosts_file(self) -> Path:
        return self.dir / "etc" / "hosts"

    def on_node(self, node: str, argv: list[str]) -> list[str]:
        """argv that runs a command on `node`: in its network namespace, with its hostname and
        the cluster's names resolving."""
        setup = 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"'
        return [
            *self.host(node).enter(),
            "unshare",
            "--uts",
            "--mount",
            "--",
            "sh",
            "-c",
            setup,
            node,
            str(self.hosts_file),
            *argv,
        ]

    def run(
        self,
        argv: list[str],
        timeout: float = 60.0,
        check: bool = True,
        env_extra: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (sinfo, scontrol, srun, sbatch...) against this cluster."""
        env = {**self.env(), **(env_extra or {})}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def node_states(self) -> dict[str, NodeState]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"]).stdout
        states = {}
        for line in out.splitlines():
            name, state, reason = line.split("|", 2)
            states[name] = NodeState(state.rstrip("*~#!%$@^-"), reason)
        return states

    def wait_for(
        self, want: set[str], nodes: list[str] | None = None, timeout_s: float = 30.0
    ) -> None:
        """Until every node (of `nodes`) is in one of the states `want`."""
        deadline = time.monotonic() + timeout_s
        names = nodes or self.nodes
        while True:
            states = self.node_states()
            if all(states.get(n) and states[n].state in want for n in names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not {sorted(want)} in {timeout_s}s: {states}")
            time.sleep(0.2)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> SlurmCluster:
        why = missing_requirements()
        if why:
            raise RuntimeError(f"cannot start a Slurm cluster: {why}")
        atexit.register(self.stop)
        self._started = True
        try:
            self.bridge.up()
            self._write_config()
            self._start_munge()
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            for node in self.nodes:
                slurmd = ["slurmd", "-D", "-N", node, "-f", str(self.conf)]
                self._spawn(f"slurmd-{node}", self.on_node(node, slurmd))
            self.wait_for({"idle"}, timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop_controller(self) -> None:
        """Stop slurmctld alone (the nodes keep running): Slurm's control plane is down."""
        stop_process(self._procs.pop("slurmctld"), 10.0)

    def start_controller(self, timeout_s: float = 30.0) -> None:
        """Start slurmctld again from its saved state."""
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        deadline = time.monotonic() + timeout_s
        while self.run(["scontrol", "ping"], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"slurmctld not answering in {timeout_s}s")
            time.sleep(0.2)

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        atexit.unregister(self.stop)
        if "slurmctld" in self._procs:
            subprocess.run(
                ["scancel", "--full", "-u", "root"], env=self.env(), capture_output=True, timeout=10
            )
        for name in sorted(self._procs, key=lambda n: n == "munged"):  # munge last
            stop_process(self._procs[name], 10.0)
        self._procs.clear()
        self.bridge.down()
        if self._own_workdir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the pieces --------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.dir / "log" / f"{name}.out"
        self._procs[name] = spawn(argv, env=self.env(), log=log, new_session=True)

    def _start_munge(self) -> None:
        """A munged of this cluster's own: a fresh 1 KiB key and a private socket."""
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m = self.dir / "munge"
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={m / 'sock'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'seed'}",
                f"--log-file={m / 'munged.log'}",
            ],
        )
        deadline = time.monotonic() + 10
        while not (m / "sock").exists():
            if self._procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(m / 'munged.log').read_text()[-800:]}")
            time.sleep(0.05)

    def _write_config(self) -> None:
        for sub in ("etc", "log", "munge", "state", "spool"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "munge").chmod(0o700)
        self.conf.write_text(render_conf(self, socket.gethostname(), free_port("0.0.0.0")))
        (self.conf.parent / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        names = "".join(f"{h.addr} {h.name}\n" for h in self.bridge.hosts)
        self.hosts_file.write_text(Path("/etc/hosts").read_text() + names)


def render_conf(c: SlurmCluster, hostname: str, ctld_port: int) -> str:
    d = c.dir
    lines = [
        f"ClusterName=sentinel{c.tag}",
        f"SlurmctldHost={hostname}({c.bridge.addr})",
        f"SlurmctldPort={ctld_port}",
        "SlurmdPort=6818",  # every slurmd has its own network namespace
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={d / 'munge' / 'sock'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool' / '%n'}",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/linear",
        "SchedulerType=sched/builtin",
        # a node whose prolog fails is drained and its job goes back to the queue, not held
        "SchedulerParameters=nohold_on_prolog_fail",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        # the nodes share the machine's cores: trust the configured count, not the hardware
        "SlurmdParameters=config_overrides",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "MessageTimeout=10",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=300",
        # a batch job waits for its nodes' prologs (a burn-in) before it counts as missing
        "BatchStartTimeout=300",
    ]
    if c.prolog is not None:
        lines += [f"Prolog={c.prolog}", "PrologFlags=Alloc"]
    lines += c.extra_conf
    for h in c.bridge.hosts:
        lines.append(f"NodeName={h.name} NodeAddr={h.addr} CPUs={c.cpus} State=UNKNOWN")
    lines.append("PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"
