"""A job whose data-parallel replicas are fault domains, as one gang to the supervisor.

With `supervisor.replicas: D` (the trainer's `--replicas ft --dp D`), the job's nodes are D
replicas of `nodes / D` nodes each, in order: replica r holds nodes r*n .. (r+1)*n - 1. Each
replica is a gang of its own (its own rendezvous, `SENTINEL_REPLICA=r`), and the replicas meet
at torchft's lighthouse (`sentinel.lighthouse`), which the supervisor runs. A fault confined to
one replica is repaired live (`Supervisor`): that replica alone stops and rejoins on its new
nodes, healing from a live peer, while the others never stop. Every other repair stops and
relaunches every replica.

`ReplicaGang` is the replicas' gangs as one `Gang`: ranks are the job's (replica r's rank k is
r * ranks_per_replica + k), and a stop stops every replica.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from sentinel.processes import Teardown
from sentinel.supervisor.launcher import Gang, RankExit

REPLICA_ENV = "SENTINEL_REPLICA"
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"


@dataclass(frozen=True)
class ReplicaLayout:
    replicas: int
    nodes_per_replica: int

    def nodes(self, job_nodes: list[str], replica: int) -> list[str]:
        n = self.nodes_per_replica
        return job_nodes[replica * n : (replica + 1) * n]

    def struck(self, job_nodes: list[str], names: Iterable[str]) -> set[int]:
        """The replicas holding any of these nodes."""
        wanted = set(names)
        return {i // self.nodes_per_replica for i, n in enumerate(job_nodes) if n in wanted}


class ReplicaGang(Gang):
    def __init__(self, gangs: dict[int, Gang], ranks_per_replica: int) -> None:
        self.gangs = dict(gangs)
        self.ranks_per_replica = ranks_per_replica

    def poll(self) -> list[RankExit]:
        return [
            e for replica in sorted(self.gangs) for e in self._poll(replica, self.gangs[replica])
        ]

    def _poll(self, replica: int, gang: Gang) -> list[RankExit]:
        """`gang`'s exits since its last poll, as the job's ranks."""
        base = replica * self.ranks_per_replica
        return [dataclasses.replace(e, rank=base + e.rank) for e in gang.poll()]

    def running(self) -> int:
        return sum(g.running() for g in self.gangs.values())

    def stop(self, grace_s: float = 5.0, keep: frozenset[str] = frozenset()) -> Teardown:
        """Every replica at once (each stop waits on its own ranks)."""
        replicas = sorted(self.gangs)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(replicas))) as pool:
            stops = list(pool.map(lambda r: self.gangs[r].stop(grace_s, keep), replicas))
        return _joined(dict(zip(replicas, stops, strict=True)), self.ranks_per_replica)

    def stop_replica(
        self, replica: int, grace_s: float, keep: frozenset[str] = frozenset()
    ) -> tuple[Teardown, list[RankExit]]:
        """One replica (a live repair): its gang leaves this set until `rejoin`. With the
        teardown, the replica's ranks that had ended before the stop signalled them, and not
        been polled yet (a rank that crashed as the repair arrived is still a crash)."""
        gang = self.gangs.pop(replica)
        ended = self._poll(replica, gang)
        result = gang.stop(grace_s, keep)
        return result, ended + self._poll(replica, gang)

    def rejoin(self, replica: int, gang: Gang) -> None:
        self.gangs[replica] = gang


def _joined(stops: dict[int, Teardown], per_replica: int) -> Teardown:
    """One teardown of several replicas' (their `ended_before` as the job's ranks)."""
    every = list(stops.values())
    return Teardown(
        pids=[p for t in every for p in t.pids],
        killed=[p for t in every for p in t.killed],
        survivors=[p for t in every for p in t.survivors],
        seconds=max((t.seconds for t in every), default=0.0),
        codes=[c for t in every for c in t.codes],
        ended_before=tuple(
            replica * per_replica + rank for replica, t in stops.items() for rank in t.ended_before
        ),
        kept=tuple(p for t in every for p in t.kept),
    )
