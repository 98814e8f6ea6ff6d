"""Trainer hooks in real multi-process gloo gangs, reporting to a real agent socket.

Each test launches a small data-parallel loop (tests/hooks_support/worker.py) as separate rank
processes; faults are injected in a rank's own work and must be found from the signals.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sentinel.fr import analyze, load_dir
from sentinel.protocol import Command, CommandKind, Source
from tests.hooks_support.gang import fake_agent, kill_all, launch, wait_all

pytestmark = pytest.mark.slow


def _env(agent_path: Path, fr_dir: Path) -> dict[str, str]:
    return {"SENTINEL_AGENT_SOCKET": str(agent_path), "SENTINEL_HOOKS_FR_DIR": str(fr_dir)}


def _wait(cond, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_faults_are_found_from_their_signals(tmp_path: Path) -> None:
    # Rank 2 does 10% more products from step 80, once the first four 20-step windows have
    # set every rank's normal; the ranks share a core (`one_core`). It is named after three
    # windows of four over the line, by step 140. The reference trainer's tests
    # (test_stragglers) hold the 1.05x target.
    args = ["--steps", "160", "--compute-s", "0.05", "--slow-rank", "2", "--slowdown", "1.10"]
    args += ["--slow-from", "80", "--spike-step", "50", "--nan-step", "70", "--sdc-rank", "3"]
    args += ["--sdc-every", "60"]
    with fake_agent(tmp_path) as agent:
        outs = wait_all(launch(4, args, _env(agent.path, tmp_path / "fr"), one_core=True))
        assert all("errors=0" in o for o in outs), outs
        anomalies = sorted(
            (rank, p.step, p.metric, p.anomaly) for rank, p in agent.payloads("rank.anomaly")
        )
        assert anomalies == [(0, 50, "loss", "spike"), (0, 70, "loss", "nan")]
        stragglers = agent.payloads("rank.straggler")
        assert {rank for rank, _ in stragglers} == {2}
        assert 80 < min(p.step for _, p in stragglers) <= 140
        assert all(p.slowdown >= 1.03 for _, p in stragglers)
        matmul = [(r, p) for r, p in agent.payloads("rank.sdc") if p.check == "matmul"]
        assert len(matmul) == 8  # two checks x four ranks
        assert all(p.mismatched_ranks == [3] for _, p in matmul)
        assert {r for r, p in matmul if p.mismatch} == {3}
        params = [p for _, p in agent.payloads("rank.sdc") if p.check == "params"]
        assert params and not any(p.mismatch for p in params)  # replicas stayed identical
        steps = agent.payloads("rank.step")
        assert {rank for rank, _ in steps} == {0, 1, 2, 3}
        sources = {(e.source.node, e.source.rank, e.source.job) for e in agent.of_kind("rank.step")}
        assert ("node-1", 2, "testjob") in sources
        assert all(p.comm_s > 0 and p.compute_s > 0.02 for _, p in steps)


def test_clean_run_flags_nothing_and_obeys_commands(tmp_path: Path) -> None:
    fr = tmp_path / "fr"
    # 20 ms of compute a step, the ranks on one core as in the faults test (`one_core`).
    args = ["--steps", "120", "--compute-s", "0.02"]
    with fake_agent(tmp_path) as agent:
        procs = launch(4, args, _env(agent.path, fr), one_core=True)
        try:
            _wait(lambda: {r for r, _ in agent.payloads("rank.step")} == {0, 1, 2, 3}, 60)
            target = Source(job="testjob")
            assert agent.broadcast(Command(kind=CommandKind.FR_DUMP, target=target)) == 4
            agent.broadcast(Command(kind=CommandKind.SDC_CHECK, target=target))
            wait_all(procs)
        finally:
            kill_all(procs)
        assert agent.payloads("rank.anomaly") == []
        assert agent.payloads("rank.straggler") == []
        sdc = agent.payloads("rank.sdc")
        assert {r for r, p in sdc if p.check == "matmul"} == {0, 1, 2, 3}
        assert not any(p.mismatch for _, p in sdc)
        dumps = agent.payloads("rank.fr_dump")
        assert sorted(r for r, _ in dumps) == [0, 1, 2, 3]
        assert all(p.reason == "command" and p.entries > 0 for _, p in dumps)
    for rank in range(4):
        dump = pickle.loads((fr / f"fr_trace_rank_{rank}").read_bytes())
        assert dump["entries"] and "pg_status" in dump
        meta = json.loads((fr / f"sentinel_fr_meta.{rank}.json").read_text())
        assert meta["process_groups"]["0"]["ranks"] == [0, 1, 2, 3]


def _hang(tmp_path: Path, world: int, stop_rank: int, where: str) -> Path:
    fr = tmp_path / "fr"
    args = ["--steps", "40", "--compute-s", "0.005", "--stop-rank", str(stop_rank)]
    args += ["--stop-step", "12", "--stop-in", where, "--hang-floor-s", "2"]
    with fake_agent(tmp_path) as agent:
        procs = launch(world, args, _env(agent.path, fr))
        try:
            _wait(lambda: len({r for r, _ in agent.payloads("rank.hang")}) == world, 90)
            _wait(lambda: len({r for r, _ in agent.payloads("rank.fr_dump")}) == world, 10)
        finally:
            kill_all(procs)
        hangs = agent.payloads("rank.hang")
        assert all(p.timeout_s == 2.0 and p.dump_path for _, p in hangs)
    return fr


def test_watchdog_dumps_name_a_rank_stopped_before_a_world_collective(tmp_path: Path) -> None:
    report = analyze(load_dir(_hang(tmp_path, 3, 1, "world")))
    assert report.verdict == "hang"
    assert report.culprit_ranks == [1] and report.waiting_ranks == [0, 2]
    assert report.collective and report.collective["pg"] == "0"
    assert report.collective["op"] == "gloo:all_reduce"


def test_subgroup_hang_root_cause_and_pytorch_analyzer(tmp_path: Path) -> None:
    fr = _hang(tmp_path, 4, 3, "sub")
    report = analyze(load_dir(fr))
    assert report.verdict == "hang"
    assert report.culprit_ranks == [3] and report.waiting_ranks == [0, 1, 2]
    assert report.collective and report.collective["pg"] == "1"

    # PyTorch's analyzer cannot read gloo dumps: their pg_config is empty.
    raw = _torch_fr_trace(fr)
    assert raw.returncode != 0 and "KeyError" in raw.stdout
    # With membership filled in from Sentinel's sidecars it answers, and agrees where it does:
    # it names rank 3 missing from the subgroup collective Sentinel reports (and also lists
    # the victim rank 2 as missing from the world group, which Sentinel does not blame).
    enriched = tmp_path / "enriched"
    enriched.mkdir()
    for rank in range(4):
        dump = pickle.loads((fr / f"fr_trace_rank_{rank}").read_bytes())
        meta = json.loads((fr / f"sentinel_fr_meta.{rank}.json").read_text())
        dump["pg_config"] = {
            n: {"name": n, "desc": g["desc"], "ranks": str(g["ranks"])}
            for n, g in meta["process_groups"].items()
        }
        (enriched / f"fr_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    out = _torch_fr_trace(enriched).stdout
    found = {
        (m["pg"], int(m["seq"])): {int(x) for x in m["missing"].split(",")}
        for m in re.finditer(
            r"sequence number: (?P<seq>\d+).*?group info: (?P<pg>[^:\s]+)"
            r".*?missing ranks: \{(?P<missing>[\d, ]+)\}",
            out,
            re.S,
        )
    }
    assert found[(report.collective["pg"], report.collective["seq"])] == {3}
    assert analyze(load_dir(enriched)).culprit_ranks == [3]

    # The culprit wrote nothing (a rank that raised tears its group down before dumping): the
    # real gloo dumps of the others, which record no completions, still name it by its absence.
    silent = tmp_path / "silent"
    shutil.copytree(fr, silent)
    for name in ("fr_trace_rank_3", "sentinel_fr_meta.3.json"):
        (silent / name).unlink()
    absent = analyze(load_dir(silent))
    assert absent.verdict == "hang" and absent.evidence == "missing_dump"
    assert absent.culprit_ranks == [3] and absent.waiting_ranks == [0, 1, 2]
    assert absent.collective is not None and absent.collective["pg"] == report.collective["pg"]
    # Ranks 0 and 1 may issue the next world collective before the victim issues the subgroup
    # one (the order races): the subgroup's is still where rank 3 first held others up, as the
    # world's has the victim behind in it, waiting elsewhere.
    raced = load_dir(silent)
    for summary in raced.summaries.values():
        for state in summary.groups.values():
            state.created_ns = {
                q: t - (10**12 if state is summary.groups.get("0") else 0)
                for q, t in state.created_ns.items()
            }
    assert analyze(raced).collective == absent.collective


def _torch_fr_trace(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )


def test_sigterm_dumps_even_when_blocked_in_a_collective(tmp_path: Path) -> None:
    # Rank 1 stops (sleeping in Python); rank 0 blocks inside a gloo all-reduce. SIGTERM must
    # leave both dumps, in PyTorch's format, and still end both processes.
    fr = tmp_path / "fr"
    args = ["--steps", "40", "--compute-s", "0.005", "--stop-rank", "1", "--stop-step", "8"]
    args += ["--hang-floor-s", "600"]
    with fake_agent(tmp_path) as agent:
        procs = launch(2, args, _env(agent.path, fr))
        try:
            _wait(lambda: {r for r, p in agent.payloads("rank.step") if p.step >= 5} == {0, 1}, 60)
            time.sleep(1.0)
            for p in procs:
                p.terminate()
            codes = [p.wait(timeout=30) for p in procs]
        finally:
            kill_all(procs)
        # Ended as SIGTERM ends a process: by its default action after the Python handler
        # dumped (-15), or by the dump thread if the main thread never got to run it (143).
        assert all(code in (-15, 128 + 15) for code in codes), codes
        reasons = {r: p.reason for r, p in agent.payloads("rank.fr_dump")}
    for rank in (0, 1):
        meta = json.loads((fr / f"sentinel_fr_meta.{rank}.json").read_text())
        assert meta["reason"] == "signal:SIGTERM"
    assert reasons.get(1) == "signal:SIGTERM"
    report = analyze(load_dir(fr))
    assert report.verdict == "hang" and report.culprit_ranks == [1]


def test_a_hung_pipeline_rank_without_a_dump_is_named_at_the_end_of_the_chain(
    tmp_path: Path,
) -> None:
    """The reference trainer in TP2 x PP2 x DP2 on real gloo ranks; rank 6 (second stage) hangs
    at the start of a step and its own dump is removed. The others wait on it along every kind
    of group: its TP partner in a tensor-parallel all-reduce, its data-parallel replica in the
    gradient all-reduce, the first stage in pipeline receives gloo does not record (and their
    own replicas behind them). The analysis follows each chain to rank 6 and says how."""
    from tests.hooks_support.straggler_runs import MODEL
    from trainer_hooks.reference.launch import launch as launch_trainer

    fr = tmp_path / "fr"
    args = [*MODEL, "--tp", "2", "--pp", "2", "--dp", "2", "--steps", "40"]
    args += ["--checkpoint-every", "0", "--out", str(tmp_path / "out")]
    args += ["--fault", "hang:rank=6,at_step=5"]
    with fake_agent(tmp_path) as agent:
        env = {**os.environ, **_env(agent.path, fr), "SENTINEL_HOOKS_HANG_FLOOR_S": "2"}
        gang = launch_trainer(8, args, log_dir=tmp_path / "logs", env=env, fork=True)
        try:
            others = set(range(8)) - {6}
            _wait(lambda: others <= {r for r, _ in agent.payloads("rank.fr_dump")}, 120)
        finally:
            gang.kill()
    recorded = analyze(load_dir(fr))
    assert recorded.verdict == "hang" and recorded.culprit_ranks == [6]
    for name in ("fr_trace_rank_6", "sentinel_fr_meta.6.json"):
        (fr / name).unlink(missing_ok=True)
    report = analyze(load_dir(fr))
    assert report.verdict == "hang" and report.evidence == "missing_dump"
    assert report.culprit_ranks == [6] and report.waiting_ranks == [0, 1, 2, 3, 4, 5, 7]
    assert "off the record in group" in report.reason and "(mesh_pp)" in report.reason
    assert "(mesh_tp)" in report.reason
