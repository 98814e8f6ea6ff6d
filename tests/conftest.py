import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from coord_util import Coordinator

# Every skip listed with its reason at the end; in CI a skip fails (see skip_policy).
from skip_policy import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sentinel_cmd() -> list[str]:
    """Run the CLI as a real subprocess, the way an operator would."""
    return [sys.executable, "-m", "sentinel"]


@pytest.fixture
def coord(tmp_path: Path) -> Iterator[Coordinator]:
    """A real `sentinel coordinator` process on a free loopback port, stopped afterwards."""
    c = Coordinator(tmp_path / "state")
    c.start()
    yield c
    c.stop()
