"""Real multi-process gloo runs of the reference trainer: equivalence, resume, faults.

Tolerances (fp32 on CPU): a TP2 x PP2 x DP2 run matches a single process with the same global
batch within LOSS_RTOL_PARALLEL relative over its first 10 steps; after resuming with half the
data-parallel width and twice the accumulation the loss continues within LOSS_RTOL_DP_SHRINK.
Every other comparison is exact (bit-identical losses and parameter digest).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainer_hooks.reference.launch import Gang, launch, read_metrics, run_gang

pytestmark = pytest.mark.slow

LOSS_RTOL_PARALLEL = 1e-5
LOSS_RTOL_DP_SHRINK = 1e-4
STEPS = 10
MODEL = ["--layers", "4", "--dim", "32", "--heads", "4", "--seq", "16", "--vocab", "128"]
MODEL += ["--corpus-tokens", "65536", "--warmup", "2", "--quiet"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def args(out: Path, data: Path, *extra: str) -> list[str]:
    return [*MODEL, "--out", str(out), "--data-dir", str(data), "--steps", str(STEPS), *extra]


def start(n: int, out: Path, data: Path, *extra: str, **kw: Any) -> Gang:
    """Ranks forked from a process that imported the trainer once (see launch.py)."""
    return launch(n, args(out, data, *extra), log_dir=out / "logs", **{"fork": True, **kw})


def run(n: int, out: Path, data: Path, *extra: str, **kw: Any) -> dict[int, dict]:
    kw.setdefault("fork", True)
    run_gang(n, args(out, data, *extra), log_dir=out / "logs", timeout=240, **kw)
    return read_metrics(out)[0]


def digest(out: Path) -> str:
    d = read_metrics(out)[1]
    assert d is not None, f"{out}: no final digest"
    return d


def losses(steps: dict[int, dict]) -> list[float]:
    return [steps[s]["loss"] for s in sorted(steps)]


def wait_for(path: Path, gang: Gang, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        assert all(p.poll() is None for p in gang.procs), "a rank exited early"
        time.sleep(0.05)


def wait_for_step(out: Path, step: int, gang: Gang, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while step not in read_metrics(out)[0]:
        assert time.monotonic() < deadline, f"timed out waiting for step {step}"
        assert all(p.poll() is None for p in gang.procs), "a rank exited early"
        time.sleep(0.05)


PAR8 = ["--tp", "2", "--pp", "2", "--mbs", "2", "--accum", "2", "--checkpoint-every", "2"]
ONE = ["--mbs", "2", "--accum", "4", "--checkpoint-every", "3", "--keep", "2"]
DP2 = ["--mbs", "2", "--accum", "2", "--checkpoint-every", "4"]


@pytest.fixture(scope="module")
def straight8(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("straight8")
    run(8, out, data_dir, *PAR8)
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("single")
    run(1, out, data_dir, *ONE, "--durable-dir", str(out / "durable"))
    return out


@pytest.fixture(scope="module")
def straight2(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("straight2")
    run(2, out, data_dir, *DP2)
    return out


def test_tp2_pp2_dp2_matches_single_process(straight8: Path, single: Path) -> None:
    par, one = read_metrics(straight8)[0], read_metrics(single)[0]
    assert sorted(par) == sorted(one) == list(range(1, STEPS + 1))
    assert losses(par) == pytest.approx(losses(one), rel=LOSS_RTOL_PARALLEL)
    assert one[STEPS]["loss"] < one[1]["loss"] - 0.3, "the loss must fall clearly"


def test_gpipe_pipeline_matches_single_process(
    single: Path, data_dir: Path, tmp_path: Path
) -> None:
    gpipe = run(2, tmp_path / "gpipe", data_dir, *ONE, "--pp", "2", "--schedule", "gpipe")
    assert losses(gpipe) == pytest.approx(losses(read_metrics(single)[0]), rel=LOSS_RTOL_PARALLEL)


def test_kill9_every_rank_then_resume_on_other_nodes_is_bit_identical(
    straight8: Path, data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    gang = start(8, out, data_dir, *PAR8)
    try:
        wait_for(out / "ckpt" / "step-00000004" / "COMMITTED", gang)
    finally:
        gang.kill(signal.SIGKILL)
    assert all(p.returncode == -signal.SIGKILL for p in gang.procs)
    assert STEPS not in read_metrics(out)[0], "killed too late to test a resume"
    # A hot spare took over: every rank now runs on another (simulated) node.
    run(
        8, out, data_dir, *PAR8, "--resume-from", "latest", node_of_rank=lambda r: f"spare-{r // 2}"
    )
    assert losses(read_metrics(out)[0]) == losses(read_metrics(straight8)[0])
    assert digest(out) == digest(straight8)


def test_node_local_fast_tier_reaches_the_durable_tier_and_resumes_bit_identically(
    straight8: Path, data_dir: Path, tmp_path: Path
) -> None:
    """Four simulated nodes, each with its own fast-tier directory: each holds only its ranks'
    part, the durable tier gets the whole checkpoint in the background, and a kill -9 of the
    gang resumes from there."""
    out = tmp_path / "node-local"
    tiers = ["--ckpt-dir", str(out / "nodes" / "{node}"), "--durable-dir", str(out / "durable")]
    node_of_rank = lambda r: f"node-{r // 2}"  # noqa: E731
    gang = start(8, out, data_dir, *PAR8, *tiers, node_of_rank=node_of_rank)
    try:
        wait_for(out / "durable" / "step-00000004" / "COMMITTED", gang)
    finally:
        gang.kill(signal.SIGKILL)
    assert STEPS not in read_metrics(out)[0], "killed too late to test a resume"
    for n in range(4):
        part = out / "nodes" / f"node-{n}" / "step-00000004"
        assert (part / "NODE_DONE").exists() and not (part / "COMMITTED").exists()
        assert sorted(p.name for p in (part / "rng").iterdir()) == [
            f"rank-{2 * n}.pt",
            f"rank-{2 * n + 1}.pt",
        ]
        assert (part / ".metadata").exists() == (n == 0)  # rank 0 writes the metadata
    whole = out / "durable" / "step-00000004"
    assert len(list((whole / "rng").iterdir())) == 8 and (whole / ".metadata").exists()
    assert not list((out / "durable").glob(".*partial"))
    run(8, out, data_dir, *PAR8, *tiers, "--resume-from", "latest", node_of_rank=node_of_rank)
    assert losses(read_metrics(out)[0]) == losses(read_metrics(straight8)[0])
    assert digest(out) == digest(straight8)


def test_node_local_fast_tier_without_a_durable_tier_is_refused(
    data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "no-durable"
    gang = start(
        2,
        out,
        data_dir,
        *DP2,
        "--ckpt-dir",
        str(out / "nodes" / "{node}"),
        node_of_rank=lambda r: f"node-{r}",
    )
    assert gang.wait(120) == [2, 2]
    assert "is node-local" in (out / "logs" / "rank-0.log").read_text()


def test_fsdp2_with_tp_and_pp_matches_and_resumes_bit_identically(
    single: Path, data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fsdp"
    fsdp = [*PAR8, "--dp-mode", "fsdp", "--checkpoint-every", "5"]
    straight = run(8, out, data_dir, *fsdp)
    assert losses(straight) == pytest.approx(
        losses(read_metrics(single)[0]), rel=LOSS_RTOL_PARALLEL
    )
    first = digest(out)
    run(8, out, data_dir, *fsdp, "--resume-from", str(out / "ckpt" / "step-00000005"))
    assert losses(read_metrics(out)[0]) == losses(straight)
    assert digest(out) == first


def test_dp_shrink_with_more_accumulation_continues_within_tolerance(
    straight2: Path, data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "shrunk"
    shutil.copytree(straight2 / "ckpt", out / "ckpt")
    step4 = str(out / "ckpt" / "step-00000004")
    resumed = run(1, out, data_dir, "--mbs", "2", "--accum", "4", "--resume-from", step4)
    ref = read_metrics(straight2)[0]
    assert sorted(resumed) == list(range(5, STEPS + 1))
    assert [resumed[s]["loss"] for s in resumed] == pytest.approx(
        [ref[s]["loss"] for s in resumed], rel=LOSS_RTOL_DP_SHRINK
    )


def test_crash_then_resume_is_bit_identical_and_does_not_recur(
    straight2: Path, data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "crash"
    gang = start(2, out, data_dir, *DP2, "--fault", "crash:rank=1,at_step=6")
    try:
        codes = gang.wait(120)
    finally:
        gang.kill()
    assert codes[1] == 1, "rank 1 must die"
    assert codes[0] not in (0, None), "its peer must fail on the dead connection"
    assert max(read_metrics(out)[0]) == 6
    run(2, out, data_dir, *DP2, "--fault", "crash:rank=1,at_step=6", "--resume-from", "latest")
    assert losses(read_metrics(out)[0]) == losses(read_metrics(straight2)[0])
    assert digest(out) == digest(straight2)


def test_hang_leaves_a_silent_live_rank(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "hang"
    # Spawned with `python -m` (fork=False): the path torchrun takes.
    gang = start(2, out, data_dir, *DP2, "--fault", "hang:rank=1,at_step=3", fork=False)
    try:
        wait_for_step(out, 3, gang)
        time.sleep(3.0)
        assert all(p.poll() is None for p in gang.procs), "a hung gang stays alive"
        assert max(read_metrics(out)[0]) == 3, "and makes no progress"
    finally:
        gang.kill(signal.SIGKILL)


def test_skip_list_resume_equals_fresh_run_with_skip_list(
    single: Path, data_dir: Path, tmp_path: Path
) -> None:
    fresh = run(1, tmp_path / "fresh", data_dir, *ONE, "--skip-batches", "7-8")
    assert [fresh[s]["batch"] for s in sorted(fresh)] == [0, 1, 2, 3, 4, 5, 6, 9, 10, 11]
    out = tmp_path / "resumed"
    shutil.copytree(single / "ckpt", out / "ckpt")
    step6 = str(out / "ckpt" / "step-00000006")
    run(1, out, data_dir, *ONE, "--skip-batches", "7-8", "--resume-from", step6)
    assert digest(out) == digest(tmp_path / "fresh") != digest(single)


def test_torn_checkpoint_is_ignored(single: Path, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "torn"
    shutil.copytree(single / "ckpt", out / "ckpt")
    (out / "ckpt" / "step-00000009" / "COMMITTED").unlink()  # the write of step 9 was cut off
    torn = out / "ckpt" / "step-00000010"
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"\0" * 100)
    resumed = run(1, out, data_dir, *ONE, "--resume-from", "latest")
    assert sorted(resumed) == [7, 8, 9, 10], "resumed from step 6, the last committed"
    assert digest(out) == digest(single)
    assert not torn.exists()


def test_durable_tier_and_keep_last_k(single: Path) -> None:
    for tier in (single / "ckpt", single / "durable"):
        names = sorted(d.name for d in tier.iterdir() if d.name.startswith("step-"))
        assert names == ["step-00000006", "step-00000009"], tier
        assert all((tier / n / "COMMITTED").exists() for n in names)


def test_lr_scale_applies_for_the_given_steps(single: Path, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "scaled"
    shutil.copytree(single / "ckpt", out / "ckpt")
    step6 = str(out / "ckpt" / "step-00000006")
    resumed = run(1, out, data_dir, *ONE, "--resume-from", step6, "--lr-scale", "0.5:2")
    ref = read_metrics(single)[0]
    assert [resumed[s]["lr"] / ref[s]["lr"] for s in (7, 8, 9, 10)] == [0.5, 0.5, 1.0, 1.0]
    assert resumed[7]["loss"] == ref[7]["loss"], "a step's loss is computed before its update"
    assert resumed[8]["loss"] != ref[8]["loss"]
    # a clean run that names the window's first step reproduces the restarted run bit for bit
    clean = run(1, tmp_path / "clean", data_dir, *ONE, "--lr-scale", "0.5:2@6")
    assert [clean[s]["lr"] for s in (7, 8, 9)] == [resumed[s]["lr"] for s in (7, 8, 9)]
    assert digest(tmp_path / "clean") == digest(out)


def test_corrupt_batch_spikes_the_loss(single: Path, data_dir: Path, tmp_path: Path) -> None:
    bad = run(1, tmp_path / "bad", data_dir, *ONE, "--fault", "corrupt_batch:batch=7")
    ref = read_metrics(single)[0]
    assert [bad[s]["loss"] for s in range(1, 8)] == [ref[s]["loss"] for s in range(1, 8)]
    assert bad[8]["loss"] > ref[8]["loss"] + 0.5, "a spike"
    assert bad[9]["loss"] < bad[8]["loss"] - 0.3, "and back down"


def test_sdc_changes_the_digest_from_its_step(single: Path, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sdc"
    bad = run(1, out, data_dir, *ONE, "--fault", "sdc:rank=0,at_step=6")
    ref = read_metrics(single)[0]
    assert [bad[s]["loss"] for s in range(1, 7)] == [ref[s]["loss"] for s in range(1, 7)]
    assert bad[7]["loss"] != ref[7]["loss"]
    assert digest(out) != digest(single)


def test_straggler_slows_its_rank(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "slow"
    steps = run(1, out, data_dir, *ONE, "--fault", "straggler:rank=0,slowdown=5,at_step=5")

    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    # The fastest step before the fault: the rank's own pace, not a moment when the machine was
    # busy with something else (a loaded stretch before the fault once hid the 5x slowdown).
    before = min(steps[s]["step_s"] for s in (2, 3, 4, 5))
    after = median([steps[s]["step_s"] for s in (7, 8, 9, 10)])
    assert after > 2.0 * before


def test_sigusr1_checkpoints_at_the_next_step(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ondemand"
    long = ["--steps", "25", "--checkpoint-every", "0"]
    long += ["--fault", "straggler:rank=0,slowdown=3,at_step=1"]
    gang = start(1, out, data_dir, *ONE, *long)
    try:
        wait_for_step(out, 2, gang)
        gang.procs[0].send_signal(signal.SIGUSR1)
        codes = gang.wait(120)
    finally:
        gang.kill()
    assert codes == [0]
    committed = sorted(p.parent.name for p in (out / "ckpt").glob("step-*/COMMITTED"))
    assert len(committed) == 1, committed
    assert 2 < int(committed[0][5:]) < 25


def test_bad_flags_exit_2(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "trainer_hooks.reference.train", "--out", str(tmp_path)]
    r = subprocess.run([*cmd, "--tp", "3"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr == "error: tp*pp*dp = 3*1*0 must equal WORLD_SIZE=1\n"
