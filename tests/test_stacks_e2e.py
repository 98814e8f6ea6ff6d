"""`sentinel stacks` on real processes: a real coordinator, a real agent per node, a gloo gang
of four ranks with trainer hooks launched by `sentinel run`. Rank 1 blocks in an all_reduce the
others never join; ranks 0, 2 and 3 wait elsewhere. The command shows rank 1 first, alone, and
the others as one group; a stopped rank is listed as silent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from coord_util import ROOT, SENTINEL, Coordinator, wait_for

from sentinel.lab.sim.fleet import SimFleet
from sentinel.processes import spawn, stop_process

NODES = ["node-0", "node-1"]


def _ready(logs: Path) -> dict[int, int]:
    """{rank: pid} of the ranks that printed `ready RANK PID`."""
    out = {}
    for log in logs.glob("g0-rank*.log"):
        for line in log.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "ready":
                out[int(parts[1])] = int(parts[2])
    return out


@pytest.fixture
def gang(coord: Coordinator, tmp_path: Path) -> Iterator[tuple[dict[int, int], Path]]:
    tokens = {}
    for n in NODES:
        tokens[n] = tmp_path / f"{n}.token"
        tokens[n].write_text(coord.token("--role", "node", "--node", n))
    (tmp_path / "job.token").write_text(coord.token("--role", "job", "--job", "job1"))
    op = tmp_path / "op.token"
    op.write_text(coord.token("--role", "operator"))
    fleet = SimFleet(tmp_path / "fleet", NODES, 2, coordinator_url=coord.url, token_files=tokens)
    logs = tmp_path / "logs"
    sup = None
    try:
        fleet.start(timeout_s=60)
        env = {
            **os.environ,
            "HANG_RANK": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "SENTINEL_SUPERVISOR__HEARTBEAT_S": "0.5",
        }
        sup = spawn(
            [
                *SENTINEL,
                "run",
                "--job-id",
                "job1",
                "--coordinator",
                coord.url,
                "--token-file",
                str(tmp_path / "job.token"),
                "--nodes",
                "2",
                "--gpus-per-node",
                "2",
                "--spares",
                "0",
                "--log-dir",
                str(logs),
                "--rank-socket-template",
                str(tmp_path / "fleet" / "{node}" / "agent.sock"),
                "--",
                sys.executable,
                str(ROOT / "tests/helpers/stacks_rank.py"),
            ],
            env=env,
            log=tmp_path / "sup.log",
        )
        wait_for(lambda: len(_ready(logs)) == 4, 120, "four ranks parked")
        yield _ready(logs), op
    finally:
        stop_process(sup, 20.0)
        fleet.stop()


def _stacks(coord: Coordinator, op: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = subprocess.run(
        [*SENTINEL, "stacks", "job1", "--coordinator", coord.url, "--token-file", str(op), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(out.stdout) if "--json" in args else {}
    return out.returncode, doc, out.stdout + out.stderr


def _main_funcs(group: dict[str, Any]) -> list[str]:
    main = next(t for t in group["threads"] if t["name"] == "MainThread")
    return [f["func"] for f in main["frames"]]


def test_stacks_show_the_rank_in_the_collective_first(
    coord: Coordinator, gang: tuple[dict[int, int], Path]
) -> None:
    pids, op = gang
    rc, doc, text = _stacks(coord, op, "--json", "--wait", "60")
    assert rc == 0, text
    assert doc["answered"] == 4 and doc["missing_ranks"] == []
    first, rest = doc["groups"]
    assert first["ranks"] == [1] and rest["ranks"] == [0, 2, 3]
    assert "wait_in_collective" in _main_funcs(first)
    assert "wait_elsewhere" in _main_funcs(rest) and "wait_in_collective" not in _main_funcs(rest)
    # every thread is there: the hooks' own answered from their transport thread
    names = {t["name"] for t in first["threads"]}
    assert {"MainThread", "sentinel-transport"} <= names

    rc, _, text = _stacks(coord, op, "--wait", "60")
    assert rc == 0, text
    assert text.index("=== ranks 1 (1 of 4) ===") < text.index("=== ranks 0,2-3 (3 of 4) ===")
    assert "in wait_in_collective" in text

    os.kill(pids[3], signal.SIGSTOP)  # a rank that cannot answer is evidence, not an error
    try:
        rc, doc, text = _stacks(coord, op, "--json", "--wait", "4")
    finally:
        os.kill(pids[3], signal.SIGCONT)
    assert rc == 1, text
    assert doc["missing_ranks"] == [3]
    assert [g["ranks"] for g in doc["groups"]] == [[1], [0, 2]]


def test_unknown_job_and_missing_token_are_bad_input(coord: Coordinator, tmp_path: Path) -> None:
    op = tmp_path / "op.token"
    op.write_text(coord.token("--role", "operator"))
    rc, _, text = _stacks(coord, op, "--wait", "1")
    assert rc == 2 and "no job 'job1'" in text
    node = tmp_path / "node.token"
    node.write_text(coord.token("--role", "node", "--node", "node-0"))
    rc, _, text = _stacks(coord, node, "--wait", "1")
    assert rc == 2 and "403" in text
