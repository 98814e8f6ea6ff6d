"""A tiny local gang launcher: N trainer processes with torchrun's environment variables.

For tests, benchmarks and the simulated fleet on one machine. `node_of_rank` lets a caller
place ranks on simulated nodes (exported as SENTINEL_NODE and LOCAL_RANK), e.g. to resume on a
different node mapping. On a real fleet use torchrun, which sets the same variables.

`fork=True` imports the trainer once and forks the ranks from this process instead of starting
`python -m ...` per rank: each rank is still its own process running the same `main(argv)`
under the same environment, but the gang skips N-1 torch imports (~4 CPU-seconds each), which
is most of a small run's cost on a 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sentinel.lighthouse import Lighthouse
from sentinel.processes import (
    fork_child,
    free_rendezvous_port,
    redirect_output,
    spawn,
)

TRAIN_MODULE = "trainer_hooks.reference.train"
# The lighthouse settings the replica mode (--replicas ft) is measured with. A killed replica
# stops heartbeating: the survivors' next quorum leaves it out once `heartbeat_timeout_ms` has
# passed (their collective with it fails at once, the quorum waits this long for it), which is
# most of their stall. Heartbeats go every 100 ms from a thread of torchft's own (not held up by
# the training loop), so 1 s is ten missed beats. A replica that stops answering but keeps
# heartbeating (a stuck device) is left out `join_timeout_ms` after its peers asked for a
# quorum without it. torchft's defaults are 5 s and 60 s.


class ForkedRank:
    """The part of Popen's interface a Gang uses, for a rank forked from this process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def _forked_rank(
    main: Callable[[list[str]], int], args: list[str], env: dict[str, str], log: Path
) -> int:
    """In the child: point fds 1/2 at the log, take the rank's environment, run main."""
    redirect_output(log)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(env)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    return main(args)


class Gang:
    """The processes of one launch; `wait` reaps them, `kill` sends a signal to every one."""

    def __init__(
        self, procs: list[subprocess.Popen[bytes]] | list[ForkedRank], logs: list[Path]
    ) -> None:
        self.procs, self.logs = procs, logs

    def wait(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        return [p.poll() for p in self.procs]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)
        for p in self.procs:
            p.wait()

    def tail(self, rank: int, chars: int = 4000) -> str:
        return self.logs[rank].read_text(errors="replace")[-chars:]


def launch(
    nproc: int,
    args: Sequence[str],
    *,
    log_dir: Path,
    node_of_rank: Callable[[int], str] | None = None,
    env: dict[str, str] | None = None,
    env_of_node: Callable[[str], dict[str, str]] | None = None,
    module: str = TRAIN_MODULE,
    fork: bool = False,
    entry: Callable[[list[str]], int] | None = None,
) -> Gang:
    """Start `nproc` ranks of `python -m module args`, each logging to log_dir/rank-R.log.

    With `fork`, `entry` (default: the module's `main`) is what each forked rank runs."""
    main = (entry or importlib.import_module(module).main) if fork else None
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_rendezvous_port()
    node_of = node_of_rank or (lambda r: "node-0")
    local_counts: dict[str, int] = {}
    procs: list[Any] = []
    logs: list[Path] = []
    for rank in range(nproc):
        node = node_of(rank)
        local = local_counts.get(node, 0)
        local_counts[node] = local + 1
        e = dict(os.environ if env is None else env)
        e.update(
            RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_RANK=str(local),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            SENTINEL_NODE=node,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        if env_of_node is not None:  # e.g. each node's own SENTINEL_AGENT_SOCKET
            e.update(env_of_node(node))
        log = log_dir / f"rank-{rank}.log"
        logs.append(log)
        if main is not None:
            pid = fork_child(functools.partial(_forked_rank, main, list(args), e, log))
            procs.append(ForkedRank(pid))
            continue
        procs.append(spawn([sys.executable, "-m", module, *args], env=e, log=log))
    return Gang(procs, logs)


def launch_replica(
    replica: int, nproc: int, args: Sequence[str], *, lighthouse: str, log_dir: Path, **kw: Any
) -> Gang:
    """One replica of the replica mode (--replicas ft): its own gang of `nproc` ranks (its own
    rendezvous) that finds its peers through the lighthouse; logs in log_dir/replica-R/."""
    env = dict(kw.pop("env", None) or os.environ)
    env.update(SENTINEL_REPLICA=str(replica), TORCHFT_LIGHTHOUSE=lighthouse)
    return launch(nproc, args, log_dir=log_dir / f"replica-{replica}", env=env, **kw)


class GangFailed(RuntimeError):
    pass


def run_gang(nproc: int, args: Sequence[str], *, log_dir: Path, timeout: float, **kw: Any) -> None:
    """Launch, wait, and raise GangFailed (with the failing ranks' log tails) unless all exit 0."""
    _wait_all([launch(nproc, args, log_dir=log_dir, **kw)], timeout)


def run_replicas(
    replicas: int, nproc: int, args: Sequence[str], *, log_dir: Path, timeout: float, **kw: Any
) -> None:
    """`run_gang` for the replica mode (--replicas ft): `replicas` gangs of `nproc` ranks each,
    met at a lighthouse of their own."""
    lighthouse = Lighthouse(log_dir / "lighthouse.log")
    try:
        gangs = [
            launch_replica(r, nproc, args, lighthouse=lighthouse.address, log_dir=log_dir, **kw)
            for r in range(replicas)
        ]
        _wait_all(gangs, timeout)
    finally:
        lighthouse.close()


def _wait_all(gangs: list[Gang], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    bad = []
    for gang in gangs:
        codes = gang.wait(max(0.0, deadline - time.monotonic()))
        if any(c is None for c in codes):
            gang.kill()
        bad += [(gang, r, c) for r, c in enumerate(codes) if c != 0]
    if bad:
        tails = "\n".join(f"--- rank {r} exit {c}\n{g.tail(r, 3000)}" for g, r, c in bad)
        raise GangFailed(f"ranks {[r for _g, r, _c in bad]} failed:\n{tails}")


def read_metrics(out: Path) -> tuple[dict[int, dict[str, Any]], str | None]:
    """Per-step lines of OUT/metrics.jsonl (a replayed step's last line wins) and the digest."""
    steps: dict[int, dict[str, Any]] = {}
    digest = None
    path = out / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if "digest" in rec:
            digest = rec["digest"]
        elif "step" in rec:
            steps[rec["step"]] = rec
    return steps, digest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m trainer_hooks.reference.launch",
        description="Run N local ranks of the reference trainer: launch --nproc 8 -- TRAIN_ARGS",
    )
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--log-dir", type=Path, default=Path("launch-logs"))
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--fork", action="store_true", help="fork ranks from one torch import")
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="the replica mode (--replicas ft): this many gangs of --nproc ranks and a lighthouse",
    )
    p.add_argument("train_args", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    if ns.nproc < 1 or ns.replicas < 1:
        p.error("--nproc and --replicas must be >= 1")
    args = ns.train_args[1:] if ns.train_args[:1] == ["--"] else ns.train_args
    try:
        if ns.replicas > 1:
            run_replicas(
                ns.replicas, ns.nproc, args, log_dir=ns.log_dir, timeout=ns.timeout, fork=ns.fork
            )
        else:
            run_gang(ns.nproc, args, log_dir=ns.log_dir, timeout=ns.timeout, fork=ns.fork)
    except GangFailed as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
