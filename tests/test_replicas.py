"""The reference trainer's fault-tolerant replica mode (--replicas ft), with real processes.

Three replicas, each a gang of two gloo ranks (TP2) forked from this process, joined by
torchft's real lighthouse (`torchft_lighthouse`, its own process) and torchft's managers:
an uninterrupted run; a replica SIGKILLed mid-run whose peers keep stepping while a spare takes
its place and heals from a live peer; a peer that dies while it sends its state; a replica whose
device stops answering; and the entry point called twice in one process.

Final-loss tolerance, FINAL_LOSS_RTOL. While a replica is missing, the two survivors split the
six micro-batches of a step 3 + 3 instead of 2 + 2 + 2, so each gradient element is the same
six fp32 terms (each g_i / 6) summed in another order: the two results differ by at most about
(6 - 1) * 2**-24 * sum|g_i|, a few units in the last place (about 1e-7 relative). AdamW carries
that difference into the parameters and later steps; over a run this short and well
conditioned it stays at that scale (measured: at most 1.5e-7 relative on any step's loss over
60 steps, 8.6e-8 on the last). 1e-4 leaves about three orders of magnitude of margin for
rounding, while a run that trains on other samples from step 10 on (`--skip-batches 10`) ends
0.14 relative away (the test below), so the tolerance still tells "the same samples, summed in
another order" from "other samples". The ledger is checked exactly, whatever the tolerance.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.lab.demo.run import MODEL_FLAGS
from sentinel.lighthouse import Lighthouse
from sentinel.processes import free_rendezvous_port
from trainer_hooks.reference.launch import Gang, launch_replica
from trainer_hooks.reference.ledger import check

pytestmark = pytest.mark.slow

FINAL_LOSS_RTOL = 1e-4
STEPS = 30
REPLICAS = 3
MODEL = [*MODEL_FLAGS, "--quiet"]  # the demo's model


def ft_args(out: Path, data: Path, *extra: str, steps: int = STEPS) -> list[str]:
    return [
        *MODEL,
        "--tp",
        "2",
        "--dp",
        str(REPLICAS),
        "--replicas",
        "ft",
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--data-dir",
        str(data),
        *extra,
    ]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


@pytest.fixture
def lighthouse(tmp_path: Path) -> Iterator[Lighthouse]:
    lh = Lighthouse(tmp_path / "lighthouse.log")
    yield lh
    lh.close()


def start(
    replica: int, args: list[str], lh: Lighthouse, log_dir: Path, env: dict[str, str] | None = None
) -> Gang:
    return launch_replica(
        replica, 2, args, lighthouse=lh.address, log_dir=log_dir, fork=True, env=env
    )


def records(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def commits(out: Path, replica: int) -> list[dict[str, Any]]:
    """The replica's committed steps, in order."""
    return [r for r in records(out) if r.get("replica") == replica and "loss" in r]


def final(out: Path) -> dict[int, dict[str, Any]]:
    return {r["replica"]: r for r in records(out) if "final_step" in r}


def stall_s(out: Path, replica: int) -> float:
    """The longest time between two of the replica's commits."""
    ts = [r["t"] for r in commits(out, replica)]
    return max(b - a for a, b in itertools.pairwise(ts))


def wait_for_step(out: Path, replica: int, step: int, gangs: list[Gang], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(r["step"] >= step for r in commits(out, replica)):
        assert time.monotonic() < deadline, f"replica {replica} never reached step {step}"
        assert all(p.poll() is None for g in gangs for p in g.procs), "a rank exited early"
        time.sleep(0.05)


def finish(gangs: list[Gang], timeout: float = 300) -> list[list[int | None]]:
    codes = [g.wait(timeout) for g in gangs]
    for g in gangs:
        g.kill()
    return codes


def run_uninterrupted(out: Path, data: Path, lh: Lighthouse, *extra: str) -> dict[int, Any]:
    gangs = [start(r, ft_args(out, data, *extra), lh, out / "logs") for r in range(REPLICAS)]
    assert finish(gangs) == [[0, 0]] * REPLICAS
    return final(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    lh = Lighthouse(out / "lighthouse.log")
    try:
        run_uninterrupted(out, data_dir, lh)
    finally:
        lh.close()
    return out


def test_uninterrupted_run_is_repeatable_and_its_ledger_exact(
    uninterrupted: Path, data_dir: Path, lighthouse: Lighthouse, tmp_path: Path
) -> None:
    first = final(uninterrupted)
    assert sorted(first) == [0, 1, 2]
    assert len({f["digest"] for f in first.values()}) == 1, "replicas diverged"
    again = run_uninterrupted(tmp_path / "again", data_dir, lighthouse)
    assert again[0]["digest"] == first[0]["digest"], "an uninterrupted run is not repeatable"
    verdict = check(uninterrupted, STEPS)
    assert verdict.exact, verdict.to_json()
    assert verdict.expected == verdict.consumed == STEPS * 6 * 2 * 16
    assert all(len(commits(uninterrupted, r)) == STEPS for r in range(REPLICAS))
    assert {c["participants"] for c in commits(uninterrupted, 1)} == {REPLICAS}


def test_killed_replica_leaves_survivors_stepping_and_a_spare_heals_from_a_peer(
    uninterrupted: Path, data_dir: Path, lighthouse: Lighthouse, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    args = ft_args(out, data_dir, "--checkpoint-every", "4")
    gangs = [start(r, args, lighthouse, out / "logs") for r in range(REPLICAS)]
    survivors = [p.pid for r in (0, 2) for p in gangs[r].procs]
    wait_for_step(out, 1, 8, gangs, timeout=120)
    killed_at = time.time()
    gangs[1].kill(signal.SIGKILL)
    # The survivors go on without it, two replicas taking the whole batch.
    wait_for_step(out, 0, commits(out, 0)[-1]["step"] + 3, [gangs[0], gangs[2]], timeout=60)
    spare_at = time.time()
    gangs[1] = start(1, [*args, "--ft-heal"], lighthouse, out / "logs-spare")  # as `sentinel run`
    codes = finish(gangs)
    assert codes == [[0, 0]] * REPLICAS
    assert [p.pid for r in (0, 2) for p in gangs[r].procs] == survivors  # never restarted
    narrow = [c for c in commits(out, 0) if killed_at < c["t"] < spare_at]
    assert narrow and {(c["participants"], c["microbatches"]) for c in narrow} == {(2, 3)}
    heals = [r for r in records(out) if "heal" in r]
    assert [h["replica"] for h in heals] == [1] and heals[0]["heal"]["step"] > narrow[0]["step"]
    spare = [c for c in commits(out, 1) if c["t"] > spare_at]
    assert spare[0]["participants"] == REPLICAS, "the spare's first step is at full width"
    assert commits(out, 0)[-1]["participants"] == REPLICAS
    launches = [r["launch"] for r in records(out) if "launch" in r]
    assert sorted(x["replica"] for x in launches) == [0, 1, 1, 2]  # the survivors launched once
    assert all(x["load_s"] == 0 and x["resume_step"] == 0 for x in launches)  # read nothing
    # The spare trains from its peers' step: the checkpoints its replica committed before the
    # kill are the job's history (a whole-job restart may need them), not set aside.
    kept = out / "ckpt/replica-1"
    assert not (kept / "superseded").exists(), sorted(p.name for p in kept.rglob("step-*"))
    done = final(out)
    assert len({f["digest"] for f in done.values()}) == 1, "the healed replica diverged"
    verdict = check(out, STEPS)
    assert verdict.exact, verdict.to_json()
    stall = max(stall_s(out, r) for r in (0, 2))
    join = spare[0]["t"] - spare_at
    print(
        f"\nsurvivors' stall {stall:.2f}s, spare join {join:.2f}s (start to first commit), "
        f"load {os.getloadavg()[0]:.2f}"
    )
    # Fail-fast, not a timeout: the collective with the dead replica fails at once and the
    # quorum drops it after the lighthouse's 1 s heartbeat timeout (torchft's timeout is 30 s).
    assert stall < 10
    # The same samples, summed in another order while a replica was missing (module docstring).
    clean = commits(uninterrupted, 0)[-1]["loss"]
    assert commits(out, 0)[-1]["loss"] == pytest.approx(clean, rel=FINAL_LOSS_RTOL)


def test_the_loss_tolerance_tells_other_samples_apart(
    uninterrupted: Path, data_dir: Path, lighthouse: Lighthouse, tmp_path: Path
) -> None:
    """Training on other samples from step 10 on moves the final loss far beyond the tolerance."""
    out = tmp_path / "skip"
    run_uninterrupted(out, data_dir, lighthouse, "--skip-batches", "10")
    clean = commits(uninterrupted, 0)[-1]["loss"]
    assert commits(out, 0)[-1]["loss"] != pytest.approx(clean, rel=FINAL_LOSS_RTOL * 10)
    assert check(out, STEPS).exact  # the skip list is the run's own: nothing is missing


def test_replicas_launched_to_heal_with_nobody_holding_the_model_train_nothing(
    data_dir: Path, lighthouse: Lighthouse, tmp_path: Path
) -> None:
    """Two replicas rejoin while the one that held the model is gone too: they must not train
    on from the seed's model as if it were the job's (the ledger would still be exact)."""
    out = tmp_path / "nothing-to-heal"
    args = ft_args(out, data_dir, "--ft-heal")
    gangs = [start(r, args, lighthouse, out / "logs") for r in (0, 1)]
    assert finish(gangs, timeout=120) == [[1, 1], [1, 1]]
    assert commits(out, 0) == commits(out, 1) == []
    assert "no replica in its quorum holds the model" in gangs[0].tail(0)


# --- a peer that dies while it sends its state ----------------------------------------------

DIE_SENDING = "SENTINEL_TEST_DIE_SENDING"


class _Tripwire:
    """Pickled only when this replica's state is streamed to a joining one: the process dies
    there, mid-transfer, as a host that fails while serving its state."""

    def __reduce__(self) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)
        return (_Tripwire, ())


def _dies_sending_main(argv: list[str]) -> int:
    """The trainer's entry, with this replica's state armed to kill it when served."""
    from trainer_hooks.reference import job, train

    served = job.Job.replica_state

    def armed(self: job.Job) -> dict[str, Any]:
        return served(self) | {"tripwire": _Tripwire()}

    if os.environ.get(DIE_SENDING):
        job.Job.replica_state = armed  # type: ignore[method-assign]
    return train.main(argv)


def test_peer_dying_while_it_sends_makes_the_joiner_heal_from_another(
    data_dir: Path, lighthouse: Lighthouse, tmp_path: Path
) -> None:
    out = tmp_path / "dies-sending"
    args = ft_args(out, data_dir)
    env = dict(os.environ, **{DIE_SENDING: "1"})
    gangs = [
        launch_replica(
            r,
            2,
            args,
            lighthouse=lighthouse.address,
            log_dir=out / "logs",
            fork=True,
            entry=_dies_sending_main,
            env=env if r == 0 else None,
        )
        for r in range(REPLICAS)
    ]
    wait_for_step(out, 1, 5, gangs, timeout=120)
    gangs[1].kill(signal.SIGKILL)
    gangs[1] = start(1, args, lighthouse, out / "logs-spare")
    # Replica 0 serves the joiner (its first rank's state, by torchft's assignment) and dies
    # sending; a supervisor then ends the rest of that replica, as Sentinel's does.
    deadline = time.monotonic() + 120
    while all(p.poll() is None for p in gangs[0].procs):
        assert time.monotonic() < deadline, "replica 0 was never asked for its state"
        time.sleep(0.05)
    gangs[0].kill(signal.SIGKILL)
    assert next(p.returncode for p in gangs[0].procs) == -signal.SIGKILL
    assert finish([gangs[1], gangs[2]]) == [[0, 0], [0, 0]]
    heals = [r for r in records(out) if "heal" in r]
    assert heals and all(h["replica"] == 1 for h in heals)
    assert len({final(out)[r]["digest"] for r in (1, 2)}) == 1
    verdict = check(out, STEPS)
    assert verdict.exact, verdict.to_json()


# --- a device that stops answering ------------------------------------------------------------


def test_stuck_replica_is_left_behind_after_the_torchft_timeout(
    data_dir: Path, lighthouse: Lighthouse, tmp_path: Path
) -> None:
    """Replica 2's first rank stops answering at step 6 (it blocks inside its step, alive and
    heartbeating): with nobody to kill it, its peers see it only when their collective with it
    times out (--ft-timeout), and the quorum leaves it out; they finish without it."""
    out = tmp_path / "stuck"
    timeout_s = 3
    args = ft_args(
        out, data_dir, "--ft-timeout", str(timeout_s), "--fault", "hang:rank=4,at_step=6"
    )
    gangs = [start(r, args, lighthouse, out / "logs") for r in range(REPLICAS)]
    try:
        assert [g.wait(240) for g in gangs[:2]] == [[0, 0], [0, 0]]
        assert all(p.poll() is None for p in gangs[2].procs), "the stuck replica is still there"
    finally:
        finish(gangs, timeout=0)
    stall = max(stall_s(out, r) for r in (0, 1))
    print(f"\nsurvivors' stall with a stuck replica and no one to kill it: {stall:.2f}s")
    assert stall >= timeout_s
    late = [r for r in records(out) if "uncommitted" in r]
    assert any(u["uncommitted"]["step"] == 6 and u["replica"] in (0, 1) for u in late)
    assert check(out, STEPS).exact


# --- the entry point called again in the same process ---------------------------------------

NEXT_PORT = "SENTINEL_TEST_NEXT_MASTER_PORT"


def _os_threads() -> list[str]:
    tasks = Path("/proc/self/task")
    return sorted((t / "comm").read_text().strip() for t in tasks.iterdir())


def _twice_main(argv: list[str]) -> int:
    """Two generations in one process, as a warm host runs them (each with a rendezvous of its
    own): the second must find nothing of the first, and nothing may pile up."""
    from trainer_hooks.reference import train

    first = train.main(argv)
    after_first = _os_threads()
    os.environ["MASTER_PORT"] = os.environ[NEXT_PORT]
    second = train.main([*argv[:-1], argv[-1] + "-again"])
    after_second = _os_threads()
    print(json.dumps({"after_first": after_first, "after_second": after_second}), flush=True)
    return first or second


def test_main_runs_twice_in_one_process(
    data_dir: Path, lighthouse: Lighthouse, tmp_path: Path
) -> None:
    out = tmp_path / "twice"
    args = [
        *MODEL,
        "--tp",
        "2",
        "--dp",
        str(REPLICAS),
        "--replicas",
        "ft",
        "--steps",
        "5",
        "--data-dir",
        str(data_dir),
        "--out",
        str(out / "gen"),
    ]
    gangs = [
        launch_replica(
            r,
            2,
            args,
            lighthouse=lighthouse.address,
            log_dir=out / "logs",
            fork=True,
            entry=_twice_main,
            env=dict(os.environ, **{NEXT_PORT: str(free_rendezvous_port())}),
        )
        for r in range(REPLICAS)
    ]
    codes = finish(gangs)
    assert codes == [[0, 0]] * REPLICAS, "".join(g.tail(0) + g.tail(1) for g in gangs)
    for g in gangs:
        for rank in (0, 1):
            line = next(x for x in g.tail(rank).splitlines() if x.startswith('{"after_first"'))
            threads = json.loads(line)
            # torchft's manager and client runtimes, its state server and quorum executor are
            # gone; what stays (the interpreter's and torchft's process-wide timeout service)
            # is the same after each generation
            assert threads["after_first"] == threads["after_second"]
            assert not any(t.startswith("torchft") for t in threads["after_second"])
    for gen in ("gen", "gen-again"):
        assert len({f["digest"] for f in final(out / gen).values()}) == 1
        assert check(out / gen, 5).exact
