"""Regenerate the committed dashboards: `python -m sentinel.dashboards [DIR]`."""

from __future__ import annotations

import sys
from pathlib import Path

from sentinel.dashboards import write_all

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "dashboards"

if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR
    for path in write_all(target):
        print(path)
