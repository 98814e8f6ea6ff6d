"""The suite's skip policy, run on a small suite of its own: every skip is listed with its reason,
and with CI=true a skip is a failure (CI installs every real component)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SUITE = """
import pytest

def test_runs():
    pass

def test_needs_a_tool():
    pytest.skip("needs the frobnicator")

@pytest.mark.skipif(True, reason="no widget here")
def test_marked():
    pass
"""


def run_suite(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_small.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(TESTS)
    if ci is not None:
        env["CI"] = ci
    cmd = [sys.executable, "-m", "pytest", "-p", "skip_policy", "-p", "no:cacheprovider"]
    cmd += ["-q", "--rootdir", str(tmp_path), str(tmp_path)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_every_skip_is_listed_with_its_reason(tmp_path: Path) -> None:
    r = run_suite(tmp_path, ci=None)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 skipped, and why" in r.stdout
    assert "needs the frobnicator (1):" in r.stdout and "no widget here (1):" in r.stdout
    assert "test_small.py::test_needs_a_tool" in r.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_a_skip_fails(tmp_path: Path, ci: str) -> None:
    r = run_suite(tmp_path, ci=ci)
    assert r.returncode == 1, r.stdout + r.stderr
    # A skip in the test body fails it; a skip marker (decided at setup) errors it.
    assert "1 failed, 1 passed, 1 error" in r.stdout
    for reason in ("needs the frobnicator", "no widget here"):
        assert f"skipped in CI, where every real component is installed: {reason}" in r.stdout
