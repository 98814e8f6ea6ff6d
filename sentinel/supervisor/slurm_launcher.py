"""The Slurm launcher: each gang generation is one job step of a kept allocation.

`srun` starts `gpus_per_node` tasks on each node of the plan (nodes of the allocation; the
others, the spares, stay idle in it); `sentinel.slurm.task` turns each into a rank with the
torchrun variables. Rank 0's store listens on the first node's Slurm address, so the gang meets
over the cluster network (set GLOO_SOCKET_IFNAME for the interface it is on). A restart is a
new step on the new node map; the allocation is never given back in between.

srun reports a task that failed as `srun: error: NODE: task T: Exited with exit code C` (or
the signal's name): that line is the rank's exit, attributed to its node.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sentinel.processes import Teardown
from sentinel.ranks.host import HostCommand
from sentinel.slurm.allocation import Allocation
from sentinel.supervisor.launcher import Gang, GangPlan, Launcher, RankExit
from sentinel.supervisor.warm import HostStarter

log = logging.getLogger("sentinel.supervisor.slurm")
_TASK = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+)$")
_SIGNALS = {signal.strsignal(s): int(s) for s in signal.Signals if signal.strsignal(s)}


def parse_task_exit(line: str) -> tuple[str, list[int], int] | None:
    """(node, Slurm task ids, returncode: -signal for a signal) from one srun error line."""
    m = _TASK.search(line.strip())
    if m is None:
        return None
    node, tasks, what = m.groups()
    ids: list[int] = []
    for part in tasks.split(","):
        lo, _, hi = part.partition("-")
        ids += range(int(lo), int(hi or lo) + 1)
    code = re.fullmatch(r"Exited with exit code (\d+)", what)
    rc = int(code.group(1)) if code else -_SIGNALS.get(what, signal.SIGKILL)
    return node, ids, rc


class SlurmGang(Gang):
    def __init__(
        self, plan: GangPlan, proc: subprocess.Popen[str], step_name: str, job: str
    ) -> None:
        self.plan, self.proc, self.step_name, self.job = plan, proc, step_name, job
        self._exits: list[RankExit] = []
        self._any_task_line = False
        self._reported: set[int] = set()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True, name="srun-stderr")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        per_node = self.plan.gpus_per_node
        for line in self.proc.stderr:
            log.info("%s", line.rstrip(), extra={"step": self.step_name})
            parsed = parse_task_exit(line)
            if parsed is None or parsed[0] not in self.plan.nodes:
                continue
            node, tasks, rc = parsed
            self._any_task_line = True
            with self._lock:  # block distribution: a task's local id is its id mod per-node
                for t in tasks:
                    rank = self.plan.nodes.index(node) * per_node + t % per_node
                    self._exits.append(RankExit(rank, node, rc))

    def poll(self) -> list[RankExit]:
        done = self.proc.poll() is not None
        if done:
            self._reader.join(timeout=5)
        with self._lock:
            out = [e for e in self._exits if e.rank not in self._reported]
            self._exits.clear()
        if done:  # srun is over: a rank with no error line exited 0, unless no task ever
            # reported (the step itself failed to launch): then every rank ended as srun did
            rc = self.proc.returncode
            seen = {e.rank for e in out} | self._reported
            rest = 0 if rc == 0 or self._any_task_line else rc
            out += [
                RankExit(r, self.plan.node_of_rank(r), rest)
                for r in range(self.plan.world_size)
                if r not in seen
            ]
        self._reported.update(e.rank for e in out)
        return out

    def running(self) -> int:
        return 0 if self.proc.poll() is not None else self.plan.world_size - len(self._reported)

    def stop(self, grace_s: float = 5.0, keep: frozenset[str] = frozenset()) -> Teardown:
        """SIGTERM to srun (it forwards it to every task); past the grace period SIGKILL to the
        step's tasks on every node (`scancel --signal=KILL`), then to srun itself. Verified
        with Slurm's own view: a step still listed by `squeue --steps` is a survivor (its
        tasks are on other hosts: this process cannot see them in its process tree)."""
        t0 = time.monotonic()
        killed: list[int] = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                killed = [self.proc.pid]
                step = self._step_id()
                if step:
                    subprocess.run(
                        ["scancel", "--signal=KILL", step], capture_output=True, timeout=30
                    )
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self._reader.join(timeout=5)
        self._reported.update(range(self.plan.world_size))
        survivors = [self.proc.pid] if killed and self._step_id() else []
        return Teardown(
            [self.proc.pid], killed, survivors, time.monotonic() - t0, [self.proc.returncode]
        )

    def _step_id(self) -> str | None:
        return step_id(self.job, self.step_name)


def step_id(job: str, name: str) -> str | None:
    """The id (JOB.STEP) of the allocation's step named `name`, while Slurm lists it."""
    out = subprocess.run(
        ["squeue", "-h", "--steps", "-j", job, "-o", "%i %j"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    for line in out.splitlines():
        step, _, step_name = line.partition(" ")
        if step_name.strip() == name:
            return step
    return None


class SlurmLauncher(Launcher):
    """Runs every generation as a step of `allocation` (asked for by the caller)."""

    def __init__(self, allocation: Allocation, log_dir: Path | None = None) -> None:
        self.allocation = allocation
        self.log_dir = log_dir

    @property
    def advertise(self) -> str:
        return local_addr_towards(self.allocation.addr(self.allocation.nodes[0]))

    def node_names(self, count: int) -> list[str]:
        if len(self.allocation.nodes) < count:
            raise ValueError(
                f"allocation {self.allocation.job_id} has {len(self.allocation.nodes)} node(s);"
                f" the job needs {count} (nodes plus spares)"
            )
        return list(self.allocation.nodes[:count])

    def argv(self, plan: GangPlan, step_name: str) -> list[str]:
        out = [
            "srun",
            f"--jobid={self.allocation.job_id}",
            f"--job-name={step_name}",
            f"--nodes={len(plan.nodes)}",
            f"--ntasks={plan.world_size}",
            f"--ntasks-per-node={plan.gpus_per_node}",
            "--distribution=block",
            f"--nodelist={','.join(plan.nodes)}",
            "--overlap",
            "--export=ALL",
            "--kill-on-bad-exit=0",
            "--unbuffered",
        ]
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            label = f"-{plan.label}" if plan.label else ""
            out.append(f"--output={self.log_dir}/g{plan.generation}{label}-%N-task%t.log")
        return [*out, sys.executable, "-m", "sentinel.slurm.task", "--", *plan.argv]

    def launch(self, plan: GangPlan) -> Gang:
        plan = dataclasses.replace(plan, master_addr=self.allocation.addr(plan.nodes[0]))
        step_name = f"sentinel-g{plan.generation}"
        env = {
            **plan.env,
            "MASTER_ADDR": plan.master_addr,
            "MASTER_PORT": str(plan.master_port),
            "SENTINEL_NODES": ",".join(plan.nodes),
            "SENTINEL_GPUS_PER_NODE": str(plan.gpus_per_node),
            "SENTINEL_GENERATION": str(plan.generation),
        }
        if plan.rank_socket_template:
            env["SENTINEL_RANK_SOCKET_TEMPLATE"] = plan.rank_socket_template
        proc = subprocess.Popen(
            self.argv(plan, step_name),
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=None if self.log_dir is not None else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        return SlurmGang(plan, proc, step_name, self.allocation.job_id)


def local_addr_towards(addr: str) -> str:
    """This host's address on the route to `addr` (a UDP socket's source after connect: no
    packet is sent): where the nodes reach the supervisor's rank pool."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return str(s.getsockname()[0])


class SlurmHosts(HostStarter):
    """Node hosts as Slurm steps of the allocation, one step of one task per node, so a node's
    host and every rank process it forked end together (`scancel` of its step). The rank pool
    listens on every interface and tells the hosts the address this host has towards them."""

    pool_bind = "0.0.0.0"

    def __init__(self, allocation: Allocation, log_dir: Path | None = None) -> None:
        self.allocation, self.log_dir = allocation, log_dir
        self.pool_advertise = local_addr_towards(allocation.addr(allocation.nodes[0]))
        self.steps: dict[str, subprocess.Popen[bytes]] = {}

    def node_names(self, count: int) -> list[str]:
        return SlurmLauncher(self.allocation).node_names(count)

    def master_addr(self, plan: GangPlan) -> str:
        return self.allocation.addr(plan.nodes[0])

    def start(self, node: str, host: HostCommand, env: dict[str, str]) -> None:
        srun = [
            "srun",
            f"--jobid={self.allocation.job_id}",
            f"--job-name=sentinel-host-{node}",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            "--overlap",
            "--export=ALL",
            "--kill-on-bad-exit=0",
            "--unbuffered",
        ]
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            srun.append(f"--output={self.log_dir}/host-{node}.log")
        self.steps[node] = subprocess.Popen(
            [*srun, *host.argv()],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=None if self.log_dir is not None else subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop(self, node: str) -> None:
        proc = self.steps.pop(node, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # srun forwards it to the host's task
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            step = step_id(self.allocation.job_id, f"sentinel-host-{node}")
            if step:
                subprocess.run(["scancel", "--signal=KILL", step], capture_output=True, timeout=30)
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
