"""Default playbooks end to end against a real supervised job (`sentinel run` + a small
training script). The training script is plain Python; what trainer hooks would detect
(loss spike, NaN, SDC digest, hang, straggler) and what the node agent would report (heat) are
posted by the test with the job's or node's own token, the way those parts report. Rank-level
commands the supervisor relays (sdc.check, fr.dump) are answered by the test reading
SENTINEL_CONTROL_FILE, as the hooks would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from coord_util import ROOT, SENTINEL, Coordinator, wait_for

from sentinel.protocol import (
    Action,
    EventBatch,
    EventKind,
    Finding,
    GpuVerdict,
    NodeHealthPayload,
    RankAnomalyPayload,
    RankHangPayload,
    RankSdcPayload,
    RankStragglerPayload,
    Source,
    Verdict,
    encode,
    make_event,
)


class Job:
    def __init__(
        self, coord: Coordinator, tmp: Path, spares: int, env: dict[str, str] | None = None
    ) -> None:
        self.coord, self.tmp = coord, tmp
        self.admin = (coord.state / "admin.token").read_text().strip()
        self.token = coord.token("--role", "job", "--job", "job1")
        (tmp / "job.token").write_text(self.token)
        self.ckpt, self.out, self.logs = tmp / "ckpt", tmp / "out", tmp / "logs"
        # the flight-recorder analyzer: a stand-in reading the toy trainer's records
        analyzer = [sys.executable, str(ROOT / "tests/helpers/fr_analyze_standin.py")]
        config = tmp / "sentinel.yaml"
        config.write_text(
            json.dumps({"supervisor": {"fr_analyze_command": analyzer, "fr_wait_s": 5}})
        )
        self.proc = subprocess.Popen(
            [
                *SENTINEL,
                "run",
                "--job-id",
                "job1",
                "--coordinator",
                coord.url,
                "--token-file",
                str(tmp / "job.token"),
                "--nodes",
                "2",
                "--gpus-per-node",
                "2",
                "--spares",
                str(spares),
                "--checkpoint-dir",
                str(self.ckpt),
                "--log-dir",
                str(self.logs),
                "--fr-dir",
                str(tmp / "fr"),
                "--config",
                str(config),
                "--",
                sys.executable,
                str(ROOT / "tests/helpers/toy_trainer.py"),
                "--steps",
                "300",
                "--ckpt-dir",
                str(self.ckpt),
                "--out",
                str(self.out),
                "--step-s",
                "0.03",
                "--fr-dir",
                str(tmp / "fr"),
            ],
            env={**os.environ, **(env or {})},
            stderr=open(tmp / "sup.log", "wb"),  # noqa: SIM115
        )

    def status(self) -> dict[str, Any]:
        jobs = self.coord.call("GET", "/v1/jobs", self.admin)
        assert isinstance(jobs, list)
        return dict(jobs[0]) if jobs else {"state": "none", "generation": -1, "status": {}}

    def wait_running(self, generation: int) -> dict[str, Any]:
        def ok() -> bool:
            s = self.status()
            return (
                s["state"] == "running"
                and s["generation"] == generation
                and bool(s["status"].get("checkpoints"))
            )

        wait_for(ok, 60, f"generation {generation} running with a checkpoint")
        return self.status()

    def post(self, kind: EventKind, source: Source, payload: Any, token: str | None = None) -> None:
        batch = EventBatch(events=[make_event(kind, source, payload)])
        self.coord.call("POST", "/v1/events", token or self.token, encode(batch).encode())

    def control(self, kind: str) -> dict[str, Any]:
        path = self.logs / "job1.control.jsonl"

        def found() -> dict[str, Any] | None:
            if not path.exists():
                return None
            lines = [json.loads(ln) for ln in path.read_text().splitlines()]
            return next((c for c in lines if c["kind"] == kind), None)

        wait_for(lambda: found() is not None, 30, f"{kind} relayed to the ranks")
        cmd = found()
        assert cmd is not None
        return cmd

    def record(self, generation: int, rank: int) -> dict[str, Any]:
        path = self.out / f"g{generation}-rank{rank}.json"
        wait_for(path.exists, 30, f"{path.name}")
        return dict(json.loads(path.read_text()))

    def finish(self) -> list[dict[str, Any]]:
        assert self.proc.wait(90) == 0
        incidents = self.coord.call("GET", "/v1/incidents", self.admin)
        assert isinstance(incidents, list)
        return incidents


@pytest.fixture
def job_factory(coord: Coordinator, tmp_path: Path) -> Iterator[Any]:
    jobs: list[Job] = []

    def make(spares: int, env: dict[str, str] | None = None) -> Job:
        jobs.append(Job(coord, tmp_path, spares, env))
        return jobs[-1]

    yield make
    for j in jobs:
        if j.proc.poll() is None:
            j.proc.kill()


def rank_src(rank: int, node: str) -> Source:
    return Source(node=node, rank=rank, job="job1")


def test_loss_spike_nan_and_sdc(job_factory: Any) -> None:
    job: Job = job_factory(spares=1)
    job.wait_running(0)
    for rank in (0, 1):  # every rank sees the spike: one incident
        job.post(
            EventKind.RANK_ANOMALY,
            rank_src(rank, "node-0"),
            RankAnomalyPayload(step=12, anomaly="spike", value=9.0, batch=12),
        )
    job.wait_running(1)
    g1 = job.record(1, 0)
    assert g1["lr"] == "0.5:100" and g1["start"] == 0  # 100 steps back: from the start
    assert g1["skip"][0] == 12 and g1["skip"][-1] == 212
    step = max(job.status()["status"]["checkpoints"]) + 2
    job.post(
        EventKind.RANK_ANOMALY,
        rank_src(1, "node-0"),
        RankAnomalyPayload(step=step, anomaly="nan", batch=step),
    )
    s2 = job.wait_running(2)
    g2 = job.record(2, 0)
    assert g2["start"] <= step and step in g2["skip"] and 12 in g2["skip"]
    step = max(s2["status"]["checkpoints"]) + 1
    job.post(
        EventKind.RANK_SDC,
        rank_src(2, "node-1"),
        RankSdcPayload(step=step, digest="bad", mismatch=True),
    )
    check = job.control("sdc.check")["args"]
    for rank in range(4):  # the recompute: rank 2's digest disagrees
        node = "node-0" if rank < 2 else "node-1"
        job.post(
            EventKind.RANK_SDC,
            rank_src(rank, node),
            RankSdcPayload(
                step=check["step"], digest="b" if rank == 2 else "a", check_id=check["check_id"]
            ),
        )
    job.wait_running(3)
    g3 = job.record(3, 2)
    assert g3["node"] == "spare-0" and g3["start"] <= step
    incidents = job.finish()
    assert [(i["playbook"], i["state"]) for i in incidents] == [
        ("loss_spike", "mitigated"),
        ("nan_loss", "mitigated"),
        ("sdc_suspected", "mitigated"),
    ]
    assert (job.coord.state / "exclude.txt").read_text().split() == ["node-1"]
    with job.coord.db() as db:  # the recompute also went to each node's agent, to relay
        relayed = db.execute(
            "SELECT target FROM commands WHERE kind='sdc.check' AND target_kind='node'"
        ).fetchall()
    assert sorted(r[0] for r in relayed) == ["node-0", "node-1"]


def _health(gpu: GpuVerdict) -> NodeHealthPayload:
    """The health event of a node whose one GPU's verdict moved."""
    return NodeHealthPayload(
        verdict=gpu.verdict, action=gpu.action, findings=gpu.findings, gpus=[gpu]
    )


def test_thermal_straggler_and_hang(job_factory: Any, coord: Coordinator) -> None:
    job: Job = job_factory(spares=3, env={"TOY_HANG": "3:5:2"})  # rank 3 sticks in gen 2
    node0 = coord.token("--role", "node", "--node", "node-0")
    job.wait_running(0)
    hot = GpuVerdict(
        gpu=1,
        verdict=Verdict.UNHEALTHY,
        action=Action.DRAIN_AND_INSPECT,
        findings=[
            Finding(
                rule="gpu_temp_unhealthy",
                verdict=Verdict.UNHEALTHY,
                action=Action.DRAIN_AND_INSPECT,
                detail="96 C",
            )
        ],
    )
    job.post(EventKind.NODE_HEALTH, Source(node="node-0"), _health(hot), token=node0)
    s1 = job.wait_running(1)
    assert s1["status"]["nodes"] == ["spare-0", "node-1"]
    assert job.record(1, 0)["resume_from"] is not None  # the checkpoint it waited for
    job.post(EventKind.RANK_STRAGGLER, rank_src(3, "node-1"), RankStragglerPayload(slowdown=1.6))
    s2 = job.wait_running(2)
    assert s2["status"]["nodes"] == ["spare-0", "spare-1"]
    job.record(2, 3)
    time.sleep(0.5)  # rank 3 is stuck now; the others' watchdogs fire
    job.post(EventKind.RANK_HANG, rank_src(0, "spare-0"), RankHangPayload(waited_s=120.0))
    # fr.dump -> ranks dump -> the supervisor analyzes -> fr.analysis names rank 3 (spare-1)
    s3 = job.wait_running(3)
    assert s3["status"]["nodes"] == ["spare-0", "spare-2"]  # the culprit's node swapped out
    assert job.record(3, 0)["world"] == 4
    incidents = job.finish()
    assert [(i["playbook"], i["state"]) for i in incidents] == [
        ("thermal_critical", "mitigated"),
        ("straggler", "mitigated"),
        ("collective_hang", "mitigated"),
    ]
    assert (coord.state / "exclude.txt").read_text().split() == ["node-0", "node-1", "spare-1"]
    audit = coord.call("GET", "/v1/audit?limit=1000", job.admin)
    assert "action.notify" in [a["what"] for a in audit]  # type: ignore[union-attr]
    # before the repair: the evidence asked for (this toy job has no agents: no rank can
    # answer, and the record says so) and the gang torn down, verified, each stage timed from
    # the hang verdict
    hang = coord.call("GET", f"/v1/incidents/{incidents[2]['id']}", job.admin)
    steps = {a["action"]: a["result"] for a in hang["actions"]}  # type: ignore[index]
    stacks = steps["evidence"]["stacks"]
    assert stacks["missing_ranks"] == "0-3" and stacks["answered"] == 0
    assert steps["evidence"]["timed_out"] == [] and steps["evidence"]["captured_s"] < 5
    teardown = steps["teardown"]
    assert teardown["teardown"]["verified"] and teardown["teardown"]["survivors"] == []
    stages = teardown["stages_s"]
    assert 0 < stages["dumps_saved_s"] <= stages["evidence_saved_s"] <= stages["all_ranks_gone_s"]
    assert stages["all_ranks_gone_s"] - stages["evidence_saved_s"] < 30


def test_killed_supervisor_leaves_the_job_visibly_lost(job_factory: Any) -> None:
    import psutil

    job: Job = job_factory(spares=0)
    job.wait_running(0)
    ranks = psutil.Process(job.proc.pid).children()
    job.proc.kill()  # kill -9: no goodbye
    job.proc.wait()
    try:
        wait_for(lambda: job.status()["state"] == "lost", 15, "job marked lost")
    finally:
        for rank in ranks:  # the orphaned ranks of this test's own supervisor
            if rank.is_running():
                rank.kill()
    audit = job.coord.call("GET", "/v1/audit", job.admin)
    assert any(a["what"] == "job.lost" for a in audit)  # type: ignore[union-attr]


def test_sigterm_stops_the_gang_and_reports_it(job_factory: Any) -> None:
    import psutil

    job: Job = job_factory(spares=0)
    job.wait_running(0)
    ranks = psutil.Process(job.proc.pid).children()
    job.proc.terminate()
    assert job.proc.wait(30) == 128 + 15
    assert not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in ranks)
    assert job.status()["state"] == "stopped"


def test_token_cli_refuses_bad_scopes(coord: Coordinator) -> None:
    for args, message in (
        (["--role", "node"], "a node token needs --node"),
        (["--role", "operator", "--job", "j"], "not scoped"),
    ):
        done = subprocess.run(
            [*SENTINEL, "token", "create", "--state-dir", str(coord.state), *args],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and message in done.stderr
    done = subprocess.run(
        [*SENTINEL, "token", "revoke", "nope", "--state-dir", str(coord.state)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "no active token with id 'nope'" in done.stderr


@pytest.mark.slow  # timed: refused within 1.5 s of the revocation
def test_a_token_revoked_by_the_cli_stops_working_within_a_second(coord: Coordinator) -> None:
    """The coordinator caches authenticated tokens; a revocation written to the store by
    another process must still reach it."""
    token = coord.token("--role", "operator")
    assert coord.call("GET", "/v1/nodes", token) == []  # authenticated, and now cached
    subprocess.run(
        [*SENTINEL, "token", "revoke", token.split("_")[1], "--state-dir", str(coord.state)],
        check=True,
        capture_output=True,
    )
    revoked_at = time.monotonic()

    def refused() -> bool:
        try:
            coord.call("GET", "/v1/nodes", token)
        except urllib.error.HTTPError as e:
            return e.code == 401
        return False

    wait_for(refused, timeout=5, what="the revoked token to be refused")
    assert time.monotonic() - revoked_at < 1.5


def test_repeated_crash_on_a_node_and_degraded_heat(job_factory: Any, coord: Coordinator) -> None:
    # rank 1 (node-0) dies at step 12 in generation 0 and at step 40 in generation 1
    job: Job = job_factory(spares=1, env={"TOY_CRASH": "1:12:0,1:40:1"})
    s2 = job.wait_running(2)
    assert s2["status"]["nodes"] == ["spare-0", "node-1"]
    warm = GpuVerdict(
        gpu=0,
        verdict=Verdict.DEGRADED,
        action=Action.NONE,
        findings=[
            Finding(
                rule="gpu_temp_degraded",
                verdict=Verdict.DEGRADED,
                action=Action.NONE,
                detail="87 C",
            )
        ],
    )
    node1 = coord.token("--role", "node", "--node", "node-1")
    job.post(EventKind.NODE_HEALTH, Source(node="node-1"), _health(warm), token=node1)
    incidents = job.finish()
    assert [(i["playbook"], i["state"]) for i in incidents] == [
        ("rank_crash", "mitigated"),
        ("rank_crash_repeat", "mitigated"),
        ("thermal_degraded", "mitigated"),
    ]
    assert (coord.state / "exclude.txt").read_text().split() == ["node-0"]
    assert job.record(2, 1)["node"] == "spare-0"
    assert job.status()["generation"] == 2  # the warning changed nothing
    # An operator tailing the coordinator's log sees each incident, step, eviction and swap.
    log = (coord.state.parent / "coord.log").read_text().splitlines()
    audit = [line.split(": ", 2)[1] for line in log if "sentinel.coordinator.audit:" in line]
    assert audit.count("incident.open") == 3
    for act in ("action.evict_node", "action.swap_spare", "action.rollback", "action.notify"):
        assert act in audit, (act, audit)
    assert sum("-> mitigated" in line for line in log) == 3


def test_repeated_crash_with_no_spare_escalates_and_a_short_gang_waits(
    job_factory: Any, coord: Coordinator
) -> None:
    # rank 1 (node-0) dies in generations 0 and 1; the job has no spare to take node-0's place
    job: Job = job_factory(spares=0, env={"TOY_CRASH": "1:12:0,1:20:1"})
    wait_for(
        lambda: (
            [i["state"] for i in job.coord.call("GET", "/v1/incidents", job.admin)]  # type: ignore[union-attr]
            == ["mitigated", "escalated"]
        ),
        60,
        "the repeat-crash run escalated",
    )
    incidents = job.coord.call("GET", "/v1/incidents", job.admin)
    assert [i["playbook"] for i in incidents] == ["rank_crash", "rank_crash_repeat"]  # type: ignore[union-attr]
    audit = job.coord.call("GET", "/v1/audit?limit=1000", job.admin)
    escalated = [a for a in audit if a["what"] == "run.escalated"]  # type: ignore[union-attr]
    assert len(escalated) == 1 and "no hot spare left to take node-0" in escalated[0]["why"]
    assert not (coord.state / "exclude.txt").exists()  # nothing evicted, the gang kept whole
    s = job.status()
    assert (s["generation"], s["status"]["nodes"], job.proc.poll()) == (
        1,
        ["node-0", "node-1"],
        None,
    )
    # A plan that would still take node-0 out with nobody in its place (as a coordinator
    # without the rail would send): the supervisor refuses to shrink the job; it stops the
    # gang and waits, visibly, for nodes (a person decides), with no new generation.
    plan = {"exclude": ["node-0"], "spare_map": {}, "reason": "operator"}
    with coord.db() as conn:
        conn.execute(
            "INSERT INTO commands (id, target_kind, target, kind, args, created_at)"
            " VALUES ('shrink', 'job', 'job1', 'job.restart', ?, ?)",
            (json.dumps(plan), time.time()),
        )
    wait_for(lambda: job.status()["state"] == "waiting_for_nodes", 60, "the job waiting for nodes")
    s = job.status()
    assert (s["generation"], s["status"]["nodes"], job.proc.poll()) == (
        1,
        ["node-0", "node-1"],
        None,
    )
