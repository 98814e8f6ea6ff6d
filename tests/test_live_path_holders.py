"""A live repair needs a replica that holds the model to stay: the supervisor counts as holding
it every replica but those rejoined and not yet seen, by torchft's real lighthouse, to train at
their peers' step. When none would be left, every replica restarts from a checkpoint instead.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from torchft._torchft import LighthouseClient

from sentinel.config import SupervisorConfig
from sentinel.lighthouse import Lighthouse, QuorumView, parse_status
from sentinel.processes import Teardown
from sentinel.protocol import Recovery, RepairPlan
from sentinel.supervisor.launcher import Gang, LocalLauncher, RankExit
from sentinel.supervisor.replicas import ReplicaGang
from sentinel.supervisor.supervisor import Supervisor


def _quorum(lh: Lighthouse, steps: dict[str, int]) -> None:
    """One quorum of these replicas (torchft's replica ids), each asking at its step."""
    client = LighthouseClient(lh.address, timedelta(seconds=5))

    def ask(replica_id: str, step: int) -> None:
        client.quorum(replica_id, timedelta(seconds=20), address="a", store_address="s", step=step)

    for replica_id in steps:  # the lighthouse waits for every replica it hears from
        client.heartbeat(replica_id)
    askers = [threading.Thread(target=ask, args=item) for item in steps.items()]
    for t in askers:
        t.start()
    for t in askers:
        t.join(30)


def test_the_lighthouse_shows_each_replicas_step_in_its_last_quorum(tmp_path: Path) -> None:
    lh = Lighthouse(tmp_path / "lighthouse.log")
    try:
        assert lh.last_quorum() is None  # none formed yet
        _quorum(lh, {"replica-0:0b1e": 12, "replica-1:77aa": -1})  # replica 1 heals in it
        first = lh.last_quorum()
        assert first is not None and first.steps == {0: 12, 1: -1}
        assert first.at_peers_step(0) and not first.at_peers_step(1)
        _quorum(lh, {"replica-0:0b1e": 13, "replica-1:77aa": 13})  # it trained at their step
        second = lh.last_quorum()
        assert second is not None and second.at_peers_step(1)
        assert second.quorum_id >= first.quorum_id
    finally:
        lh.close()
    assert lh.last_quorum() is None  # gone: nothing is known


def test_a_status_page_without_a_quorum_shows_none() -> None:
    assert parse_status("Current quorum_id: 0 <br>\nNext quorum status: not ready") is None
    assert parse_status("") is None


class _Running(Gang):
    def poll(self) -> list[RankExit]:
        return []

    def running(self) -> int:
        return 2

    def stop(self, grace_s: float = 5.0, keep: frozenset[str] = frozenset()) -> Teardown:
        raise AssertionError("a test of the path's choice stops nothing")


class _Lighthouse:
    def __init__(self, view: QuorumView | None) -> None:
        self.view = view

    def last_quorum(self) -> QuorumView | None:
        return self.view


def _supervisor(tmp_path: Path, replicas: int = 2) -> Supervisor:
    cfg = SupervisorConfig(job_id="j", nodes=replicas, gpus_per_node=2, spares=2, replicas=2)
    sup = Supervisor(cfg, ["train"], LocalLauncher(tmp_path), "t", tmp_path / "control")
    sup.gang = ReplicaGang({r: _Running() for r in range(replicas)}, ranks_per_replica=2)
    return sup


def _evict(node: str) -> RepairPlan:
    return RepairPlan(exclude=[node], path=Recovery.LIVE)


def test_a_fault_in_the_only_replica_holding_the_model_restarts_every_replica(
    tmp_path: Path,
) -> None:
    sup = _supervisor(tmp_path)
    assert sup._struck_replicas(_evict("node-0")) == {0}  # replica 1 holds the model: live
    sup.joining = {1: 4}  # replica 1 rejoined (the lighthouse's quorum 4 before it)
    assert sup._struck_replicas(_evict("node-0")) == set()  # nothing left to heal from
    assert sup._struck_replicas(_evict("node-1")) == {1}  # the joiner itself: live again


@pytest.mark.parametrize(
    ("view", "healed"),
    [
        (None, False),  # the lighthouse did not answer
        (QuorumView(4, {0: 30, 1: 30}), False),  # a quorum from before it rejoined
        (QuorumView(5, {0: 30, 1: -1}), False),  # it heals in this one
        (QuorumView(5, {0: 31}), False),  # not in the last quorum
        (QuorumView(5, {0: 31, 1: 31}), True),  # it trained at its peers' step
    ],
)
def test_a_rejoined_replica_holds_the_model_once_it_trained_at_its_peers_step(
    tmp_path: Path, view: QuorumView | None, healed: bool
) -> None:
    sup = _supervisor(tmp_path)
    sup.joining = {1: 4}
    sup.lighthouse = _Lighthouse(view)  # type: ignore[assignment]
    sup._count_healed()
    assert (1 not in sup.joining) == healed
    assert sup._struck_replicas(_evict("node-0")) == ({0} if healed else set())


def test_a_rejoined_replica_whose_quorum_before_is_unknown_stays_healing(tmp_path: Path) -> None:
    """With no quorum id from before its rejoin, no quorum can be shown to have formed after it,
    even one where it stands at its peers' step: it is not counted as holding the model."""
    sup = _supervisor(tmp_path)
    sup.joining = {1: None}
    sup.lighthouse = _Lighthouse(QuorumView(9, {0: 31, 1: 31}))  # type: ignore[assignment]
    sup._count_healed()
    assert sup.joining == {1: None}
