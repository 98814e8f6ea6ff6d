"""`sentinel run --exclude-file`: nodes a burn-in failed never get ranks; spares take their
places in the first node map the coordinator sees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from coord_util import SENTINEL, Coordinator

from sentinel.supervisor.job import initial_job


def test_excluded_nodes_are_replaced_by_spares_in_order() -> None:
    job = initial_job(4, 2, 2, frozenset({"node-1", "node-3"}))
    assert (job.nodes, job.spares) == (["node-0", "spare-0", "node-2", "spare-1"], [])
    job = initial_job(3, 2, 2, frozenset({"spare-0"}))  # a failed spare is no spare
    assert (job.nodes, job.spares) == (["node-0", "node-1", "node-2"], ["spare-1"])


def test_too_few_spares_is_an_error() -> None:
    with pytest.raises(ValueError, match="node-1 is excluded and no spare is left"):
        initial_job(2, 0, 2, frozenset({"node-1"}))


def _run(
    tmp_path: Path, url: str, token: Path, exclude: str, spares: int
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "exclude.txt").write_text(exclude)
    record = tmp_path / "nodes"
    record.mkdir(exist_ok=True)
    trainer = [
        sys.executable,
        "-c",
        "import os, pathlib; pathlib.Path(os.environ['OUT'], os.environ['RANK'])"
        ".write_text(os.environ['SENTINEL_NODE'])",
    ]
    return subprocess.run(
        [
            *SENTINEL,
            "run",
            "--job-id",
            "ex",
            "--coordinator",
            url,
            "--token-file",
            str(token),
            "--nodes",
            "3",
            "--gpus-per-node",
            "1",
            "--spares",
            str(spares),
            "--exclude-file",
            str(tmp_path / "exclude.txt"),
            "--",
            *trainer,
        ],
        env={**_env(), "OUT": str(record)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}


def test_sentinel_run_launches_on_the_spare(coord: Coordinator, tmp_path: Path) -> None:
    token = tmp_path / "job.token"
    token.write_text(coord.token("--role", "job", "--job", "ex"))
    done = _run(tmp_path, coord.url, token, "# burn-in\nnode-1\n", spares=1)
    assert done.returncode == 0, done.stderr[-2000:]
    placed = {p.name: p.read_text() for p in (tmp_path / "nodes").iterdir()}
    assert placed == {"0": "node-0", "1": "spare-0", "2": "node-2"}
    admin = (coord.state / "admin.token").read_text().strip()
    job = coord.call("GET", "/v1/jobs", admin)[0]  # type: ignore[index]
    assert job["status"]["nodes"] == ["node-0", "spare-0", "node-2"]
    assert job["status"]["spares"] == []


def test_bad_exclude_file_exits_2(coord: Coordinator, tmp_path: Path) -> None:
    token = tmp_path / "job.token"
    token.write_text(coord.token("--role", "job", "--job", "ex"))
    done = _run(tmp_path, coord.url, token, "node-1\nnode-2\n", spares=1)
    assert done.returncode == 2 and "no spare is left" in done.stderr
    done = _run(tmp_path, coord.url, token, "gpu7\n", spares=1)
    assert done.returncode == 2 and "not node names: gpu7" in done.stderr
    assert not (tmp_path / "nodes" / "0").exists()  # nothing was launched
