"""`sentinel run` launches the reference trainer under a real coordinator; a rank crash is
repaired by the rank_crash playbook (restart from the last checkpoint) and the run ends with
parameters bit-identical to a run that never crashed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from coord_util import SENTINEL, Coordinator, wait_for

from trainer_hooks.reference.launch import read_metrics, run_gang

pytestmark = pytest.mark.slow

MODEL = [
    "--layers",
    "2",
    "--dim",
    "32",
    "--heads",
    "4",
    "--seq",
    "16",
    "--vocab",
    "128",
    "--corpus-tokens",
    "32768",
    "--warmup",
    "2",
    "--quiet",
    "--tp",
    "2",
    "--mbs",
    "2",
    "--accum",
    "2",
    "--steps",
    "8",
    "--checkpoint-every",
    "3",
]


def test_rank_crash_is_repaired_to_a_bit_identical_finish(
    coord: Coordinator, tmp_path: Path
) -> None:
    data = tmp_path / "corpus"
    straight = tmp_path / "straight"
    run_gang(
        4,
        [*MODEL, "--out", str(straight), "--data-dir", str(data)],
        log_dir=straight / "logs",
        timeout=240,
        fork=True,
    )
    reference_steps, reference_digest = read_metrics(straight)
    assert reference_digest is not None

    admin = (coord.state / "admin.token").read_text().strip()
    (tmp_path / "job.token").write_text(coord.token("--role", "job", "--job", "ref"))
    out, ckpt = tmp_path / "supervised", tmp_path / "supervised" / "ckpt"
    trainer = [
        sys.executable,
        "-m",
        "trainer_hooks.reference.train",
        *MODEL,
        "--out",
        str(out),
        "--data-dir",
        str(data),
        "--ckpt-dir",
        str(ckpt),
        "--fault",
        "crash:rank=1,at_step=5",
    ]
    sup = subprocess.Popen(
        [
            *SENTINEL,
            "run",
            "--job-id",
            "ref",
            "--coordinator",
            coord.url,
            "--token-file",
            str(tmp_path / "job.token"),
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--checkpoint-dir",
            str(ckpt),
            "--log-dir",
            str(tmp_path / "logs"),
            "--",
            *trainer,
        ],
        env=os.environ.copy(),
        stderr=open(tmp_path / "sup.log", "wb"),  # noqa: SIM115
    )
    try:
        assert sup.wait(400) == 0, (tmp_path / "sup.log").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
    incidents = coord.call("GET", "/v1/incidents", admin)
    assert [(i["playbook"], i["state"]) for i in incidents] == [("rank_crash", "mitigated")]  # type: ignore[union-attr]
    steps, digest = read_metrics(out)
    assert digest == reference_digest  # resumed from step 3's checkpoint, finished identical
    assert [steps[s]["loss"] for s in sorted(steps)] == [
        reference_steps[s]["loss"] for s in sorted(reference_steps)
    ]
    wait_for(lambda: coord.call("GET", "/v1/jobs", admin)[0]["state"] == "finished")  # type: ignore[index]


def test_a_crash_at_the_same_step_on_every_restart_stops_the_job_after_the_budget(
    coord: Coordinator, tmp_path: Path
) -> None:
    """A poison crash: rank 1 dies at step 5 on every run that reaches it. The job is restarted
    from step 3's checkpoint three times (the default restart budget), then the fourth crash,
    with still no checkpoint committed since, stops it: the incident is escalated with the
    restarts as its history, the supervisor holds the job stopped, and no node is evicted
    (the crash comes back before any progress, so it is not the node's)."""
    admin = (coord.state / "admin.token").read_text().strip()
    (tmp_path / "job.token").write_text(coord.token("--role", "job", "--job", "poison"))
    out, ckpt = tmp_path / "supervised", tmp_path / "supervised" / "ckpt"
    trainer = [
        sys.executable,
        "-m",
        "trainer_hooks.reference.train",
        *MODEL,
        "--out",
        str(out),
        "--data-dir",
        str(tmp_path / "corpus"),
        "--ckpt-dir",
        str(ckpt),
        "--fault",
        "crash:rank=1,at_step=5,recurs=true",
    ]
    sup = subprocess.Popen(
        [
            *SENTINEL,
            "run",
            "--job-id",
            "poison",
            "--coordinator",
            coord.url,
            "--token-file",
            str(tmp_path / "job.token"),
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--spares",
            "1",
            "--checkpoint-dir",
            str(ckpt),
            "--log-dir",
            str(tmp_path / "logs"),
            "--",
            *trainer,
        ],
        env=os.environ.copy(),
        stderr=open(tmp_path / "sup.log", "wb"),  # noqa: SIM115
    )

    def incidents() -> list[dict[str, object]]:
        return coord.call("GET", "/v1/incidents", admin)  # type: ignore[return-value]

    try:
        wait_for(lambda: any(i["state"] == "escalated" for i in incidents()), timeout=300)
        wait_for(lambda: coord.call("GET", "/v1/jobs", admin)[0]["state"] == "stopped")  # type: ignore[index]
        assert sup.poll() is None  # the supervisor waits, with no gang, for a person
    finally:
        sup.terminate()
        sup.wait(60)
    found = sorted(incidents(), key=lambda i: int(i["id"]))  # type: ignore[call-overload]
    assert [(i["playbook"], i["state"]) for i in found] == [("rank_crash", "mitigated")] * 3 + [
        ("rank_crash", "escalated")
    ]
    escalated = coord.call("GET", f"/v1/incidents/{found[-1]['id']}", admin)
    (resume,) = [s for s in escalated["actions"] if s["action"] == "resume"]  # type: ignore[index]
    assert "restart budget spent: 3 restart(s) for rank_crash" in resume["result"]["error"]
    assert resume["result"]["newest_checkpoint"] == 3 and len(resume["result"]["restarts"]) == 3
    nodes = coord.call("GET", "/v1/nodes", admin)
    assert not [n for n in nodes if n["state"] in ("draining", "evicted")], nodes  # type: ignore[union-attr]
