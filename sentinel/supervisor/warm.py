"""Warm ranks: a gang generation that starts nothing, and a stop that keeps the survivors.

`WarmLauncher` keeps one node host per node of the job and per hot spare (started once, through
a `HostStarter`: a local process, or a Slurm step on the node), and a warm rank process per GPU
slot, forked from its host with the trainer imported. Launching a generation hands each rank's
slot its assignment (`sentinel.ranks.wire.Run`); no interpreter starts, no torch is imported.

`WarmGang.stop` ends a generation without ending its processes where it can: the ranks of the
nodes it may keep are asked to leave at their next step boundary (all together: they agree on
it in their per-step collective) and stay warm for the next generation; every other rank
process (an evicted node's, a culprit's, one that failed on its own or did not leave within the
grace period) is killed, and its slot gets a fresh fork when a generation needs it.

Which rank failed: a collective fails on every rank once one rank's process dies ("connection
closed by peer"). Only the supervisor sees the whole gang, so the gang decides: an error is a
rank's own only when no process of the generation died within `settle_s` of it and no stop was
under way; otherwise it is the dead peer's, and the rank that reported it is kept.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path

from sentinel.processes import Teardown, teardown
from sentinel.protocol import Recovery
from sentinel.ranks import wire
from sentinel.ranks.host import HostCommand, trainer_module
from sentinel.ranks.pool import PoolError, RankPool, RankProcess
from sentinel.supervisor.launcher import Gang, GangPlan, GangStartError, Launcher, RankExit
from sentinel.supervisor.templates import TEMPLATE_ANSWER_S, ForkedHost, Template

log = logging.getLogger("sentinel.supervisor.warm")
_GONE_CODE_WAIT_S = 1.0  # after a process vanished, how long its host's exit code may take
_KILL_WAIT_S = 5.0


class HostStarter(ABC):
    """Starts and ends the node hosts of one launcher (local processes, Slurm steps)."""

    # Where the rank pool listens, and the address the hosts are told to reach it at.
    pool_bind: str = "127.0.0.1"
    pool_advertise: str | None = None

    @abstractmethod
    def start(self, node: str, host: HostCommand, env: dict[str, str]) -> None:
        """Start `host` (a node host) on `node` with `env` added to this process's own."""

    @abstractmethod
    def stop(self, node: str) -> None:
        """End the node host on `node` and everything it forked, bounded and verified."""

    def master_addr(self, plan: GangPlan) -> str:
        """The address rank 0's rendezvous store listens on."""
        return plan.master_addr

    def close(self) -> None:  # noqa: B027 - most starters keep nothing beside their hosts
        """End what the starter keeps beside the hosts (after every host is stopped)."""


class LocalHosts(HostStarter):
    """Node hosts as local processes (the simulated fleet: every node on this machine), each
    leading a process group of its own with the rank processes it forks. They are forked from
    one template process per trainer (`sentinel.ranks.template`), which imports it once for
    every node."""

    def __init__(self, log_dir: Path | None = None, stop_grace_s: float = 5.0) -> None:
        self.log_dir, self.stop_grace_s = log_dir, stop_grace_s
        self.procs: dict[str, ForkedHost] = {}
        self._templates: dict[tuple[str, str], Template] = {}

    def _log(self, name: str) -> Path | None:
        if self.log_dir is None:
            return None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self.log_dir / name

    def start(self, node: str, host: HostCommand, env: dict[str, str]) -> None:
        key = (host.python, trainer_module(host.trainer)[1])
        template = self._templates.get(key)
        if template is None or template.gone:
            argv = [host.python, "-m", "sentinel.ranks.template", "--", *host.trainer]
            template = Template(argv, {**os.environ, **env}, self._log("host-template.log"))
            self._templates[key] = template
        log_file = self._log(f"host-{node}.log")
        request = {
            "node": node,
            "connect": host.connect,
            "env": {**os.environ, **env},
            "log": str(log_file) if log_file else None,
        }
        pid = template.fork(request, TEMPLATE_ANSWER_S)
        if pid is None:  # its ranks do not come: the launch fails and says which
            log.error("no node host on %s: the host template did not answer", node)
            return
        self.procs[node] = ForkedHost.of(pid)

    def stop(self, node: str) -> None:
        proc = self.procs.pop(node, None)
        if proc is not None:
            result = teardown([proc], self.stop_grace_s, group=True)
            if not result.verified:
                log.error("node host of %s survived SIGKILL: %s", node, result.survivors)

    def close(self) -> None:
        for template in self._templates.values():
            template.close(self.stop_grace_s)
        self._templates.clear()


class WarmGang(Gang):
    def __init__(
        self,
        plan: GangPlan,
        pool: RankPool,
        procs: dict[int, RankProcess],
        leave_grace_s: float,
        settle_s: float = 0.5,
    ) -> None:
        self.plan, self.pool, self.procs = plan, pool, procs
        self.leave_grace_s, self.settle_s = leave_grace_s, settle_s
        self._reported: set[int] = set()
        self._own_failures: set[int] = set()  # ranks whose processes cannot be used again
        self._stopping = False

    def _mine(self, proc: RankProcess) -> bool:
        """Its last run is this generation (a process reused later belongs to that one)."""
        return proc.generation == self.plan.generation

    def _exit(self, rank: int, now: float) -> RankExit | None:
        """How `rank` ended, once that is settled; None while it runs or is being judged.

        A process that died crashed. An error is a peer's (collateral) when a process of the
        generation died, when a rank failed on its own, or during a stop; otherwise it is the
        rank's own, unless it says a link to a peer ended (then nobody owns the failure: it is
        reported, but the process is kept). Errors wait `settle_s` for the death or the own
        failure that explains them."""
        proc = self.procs[rank]
        node = self.plan.node_of_rank(rank)
        if proc.gone_at is not None:
            if proc.exit_code is None and now - proc.gone_at < _GONE_CODE_WAIT_S:
                return None
            self._own_failures.add(rank)
            code = proc.exit_code if proc.exit_code is not None else -9
            # a process that vanished did not finish
            return RankExit(rank, node, code or -9, why="its process ended")
        ended = proc.ended
        if ended is None or not self._mine(proc):
            return None
        if ended.code == 0:
            return RankExit(rank, node, 0)
        if not ended.peer_lost:
            self._own_failures.add(rank)
            return RankExit(rank, node, ended.code, why=ended.error)
        if self._stopping or self._a_process_died() or self._own_failures:
            return RankExit(rank, node, ended.code, collateral=True)
        assert proc.ended_at is not None
        if now - proc.ended_at < self.settle_s:
            return None
        return RankExit(rank, node, ended.code, why=ended.error)

    def _a_process_died(self) -> bool:
        return any(p.gone for p in self.procs.values())

    def poll(self) -> list[RankExit]:
        now = time.monotonic()
        out = []
        for rank in self.procs:
            if rank in self._reported:
                continue
            ended = self._exit(rank, now)
            if ended is not None:
                self._reported.add(rank)
                if not ended.collateral:
                    out.append(ended)
        return out

    def running(self) -> int:
        return sum(1 for p in self.procs.values() if self._mine(p) and p.busy)

    def stop(self, grace_s: float = 5.0, keep: frozenset[str] = frozenset()) -> Teardown:
        """End the generation: ranks on `keep` nodes leave and stay warm; the others are killed
        (verified gone). A healthy gang leaves together at its next step boundary; a broken one
        (a process died, a rank failed), or one that has not left within the leave grace
        period, is told to leave at once (its connections cut, so no rank waits on a dead or
        stuck peer); a rank still running after that is killed."""
        t0 = time.monotonic()
        ranks = list(self.procs)
        before = [r for r in ranks if r not in self._reported and self.procs[r].gone]
        broken = self._broken()
        self._stopping = True
        doomed = {
            r for r in ranks if self.plan.node_of_rank(r) not in keep or r in self._own_failures
        }
        killed = self._kill(r for r in doomed if not self.procs[r].gone)
        leaving = [r for r in ranks if r not in doomed and self.procs[r].busy]
        self._leave(leaving, at_once=broken)
        if not broken and not self._left(leaving, self.leave_grace_s):
            self._leave([r for r in leaving if self.procs[r].busy], at_once=True)
        self._left(leaving, self.leave_grace_s)
        stuck = [r for r in leaving if self.procs[r].busy]
        # A process that died instead of leaving crashed as the stop arrived: still a crash.
        died = [r for r in leaving if self.procs[r].gone]
        if stuck:
            log.warning("ranks %s did not leave generation %d: killed", stuck,
                        self.plan.generation)  # fmt: skip
        killed += self._kill(stuck)
        ended = doomed | set(stuck)
        if not self.pool.wait(lambda: all(self.procs[r].gone for r in ended), _KILL_WAIT_S):
            survivors = [self.procs[r].pid for r in ended if not self.procs[r].gone]
        else:
            survivors = []
        unreported = [*before, *died]  # the next poll reports them, once their codes are in
        self._await_exit_codes(unreported)
        self._reported.update(r for r in ranks if r not in unreported)
        kept = tuple(p.pid for r, p in self.procs.items() if r not in ended and not p.gone)
        return Teardown(
            pids=[p.pid for p in self.procs.values()],
            killed=killed,
            survivors=survivors,
            seconds=time.monotonic() - t0,
            codes=[self._code(p) for p in self.procs.values()],
            ended_before=tuple(ranks.index(r) for r in before),
            kept=kept,
        )

    def _await_exit_codes(self, ranks: list[int]) -> None:
        """Wait, bounded, for the node hosts to report how these dead processes ended."""
        self.pool.wait(
            lambda: all(self.procs[r].exit_code is not None for r in ranks), _GONE_CODE_WAIT_S
        )

    def _broken(self) -> bool:
        """A process died or a rank ended in an error: no step boundary will come."""
        return any(p.gone or (p.ended is not None and p.ended.code) for p in self.procs.values())

    def _leave(self, ranks: list[int], at_once: bool) -> None:
        for r in ranks:
            self.pool.leave(self.procs[r], self.plan.generation, at_once=at_once)

    def _left(self, ranks: list[int], within_s: float) -> bool:
        return self.pool.wait(lambda: not any(self.procs[r].busy for r in ranks), within_s)

    def _kill(self, ranks: Iterable[int]) -> list[int]:
        pids = []
        for r in ranks:
            self.pool.kill(self.procs[r])
            pids.append(self.procs[r].pid)
        return pids

    @staticmethod
    def _code(proc: RankProcess) -> int | None:
        if proc.exit_code is not None:
            return proc.exit_code
        return proc.ended.code if proc.ended is not None else None


class WarmLauncher(Launcher):
    """Generations on warm rank processes; node hosts started through `starter`."""

    def __init__(
        self,
        starter: HostStarter,
        log_dir: Path | None = None,
        leave_grace_s: float = 3.0,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.starter, self.log_dir = starter, log_dir
        self.leave_grace_s, self.start_timeout_s = leave_grace_s, start_timeout_s
        self._secret = secrets.token_urlsafe(32)
        self.pool = RankPool(self._secret, starter.pool_bind, starter.pool_advertise)
        self._hosts: set[str] = set()

    @property
    def paths(self) -> frozenset[Recovery]:
        return frozenset({Recovery.WARM_RESTART, Recovery.RESTART})

    def node_names(self, count: int) -> list[str] | None:
        names = getattr(self.starter, "node_names", None)
        return names(count) if names is not None else None

    @property
    def advertise(self) -> str:
        return self.starter.pool_advertise or self.starter.pool_bind

    def release(self, node: str) -> None:
        """The node left the job (evicted): its host and rank processes end."""
        if node in self._hosts:
            self.pool.retire(node)
            self.starter.stop(node)
            self._hosts.discard(node)

    def _hosts_for(self, plan: GangPlan) -> None:
        """A node host on every node of the plan and every spare."""
        wanted = [*plan.nodes, *plan.spares]
        python = trainer_module(plan.argv)[0] or sys.executable
        for node in wanted:
            if node in self._hosts and self.pool.host_lost(node):  # it died: start it again
                self.starter.stop(node)
                self._hosts.discard(node)
            if node not in self._hosts:
                env = {**plan.env, wire.SECRET_ENV: self._secret}
                host = HostCommand(python, self.pool.address, node, list(plan.argv))
                self.starter.start(node, host, env)
                self._hosts.add(node)
        # The gang's nodes are waited for (one whose host does not come has its ranks fail to
        # start: launch says which); a spare's host joins when it is ready.
        gang = plan.nodes
        self.pool.wait(lambda: all(self.pool.host_ready(n) for n in gang), self.start_timeout_s)

    def launch(self, plan: GangPlan) -> Gang:
        plan = plan.with_master(self.starter.master_addr(plan))
        self._hosts_for(plan)
        _, module, args = trainer_module(plan.argv)
        per_node = plan.gpus_per_node
        slots = [(plan.node_of_rank(r), r % per_node) for r in range(plan.world_size)]
        standby = [(n, s) for n in plan.spares for s in range(per_node)]  # warm spares
        self.pool.prefork(standby)  # warm spares: a process per slot, waiting for a rank
        try:  # all of the gang's processes, or none of them runs the generation
            procs = self.pool.spawn(slots, self.start_timeout_s)
        except PoolError as e:
            failed = [
                RankExit(r, node, 1)
                for r, (node, slot) in enumerate(slots)
                if (node, slot) in e.missing
            ]
            raise GangStartError(str(e), failed) from None
        ranks = {r: procs[slot] for r, slot in enumerate(slots)}
        for r, proc in ranks.items():
            log_file = None
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log_file = str(self.log_dir / plan.log_name(r))
            env = plan.rank_env(r, os.environ)
            run = wire.Run(generation=plan.generation, rank=r, module=module, argv=args,
                           env=env, log=log_file)  # fmt: skip
            self.pool.run(proc, run)
        log.info(
            "generation %d on warm ranks", plan.generation,
            extra={"generation": plan.generation, "label": plan.label, "ranks": [
                {"rank": r, "node": p.node, "pid": p.pid, "reused": p.runs > 1}
                for r, p in ranks.items()
            ]},
        )  # fmt: skip
        return WarmGang(plan, self.pool, ranks, self.leave_grace_s)

    def close(self) -> None:
        self.pool.close()
        for node in sorted(self._hosts):
            self.starter.stop(node)
        self._hosts.clear()
        self.starter.close()
