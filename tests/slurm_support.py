"""Starting a real Slurm cluster in tests: skip where it cannot run, never in CI."""

from __future__ import annotations

import os

import pytest

from sentinel.slurm.cluster import missing_requirements


def require_cluster() -> None:
    """Skip (with the reason) where a cluster cannot start; in CI that is a failure: the CI
    machine is root on Linux and `.ci/run` installs slurm-wlm and munge."""
    why = missing_requirements()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the Slurm cluster must run in CI: {why}")
    pytest.skip(f"a real Slurm cluster cannot start here: {why}")
