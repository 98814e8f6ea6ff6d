import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sentinel_cmd() -> list[str]:
    """Run the CLI as a real subprocess, the way an operator would."""
    return [sys.executable, "-m", "sentinel"]
