"""Sentinel's Grafana dashboards, built from Python so the committed JSON is reproducible.

`python -m sentinel.dashboards [DIR]` writes them (default: `dashboards/` at the repository root);
a test checks the committed files equal what the builders produce.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sentinel.dashboards import burn_in, fleet_health, incidents, training_run
from sentinel.dashboards.panels import JSON

# File stem -> builder. The stem is the file name under dashboards/.
BUILDERS: dict[str, Callable[[], JSON]] = {
    "fleet-health": fleet_health.build,
    "training-run": training_run.build,
    "burn-in": burn_in.build,
    "incidents-playbooks": incidents.build,
}


def build_all() -> dict[str, JSON]:
    return {name: build() for name, build in BUILDERS.items()}


def render(dashboard: JSON) -> str:
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, dashboard in build_all().items():
        path = directory / f"{name}.json"
        path.write_text(render(dashboard))
        paths.append(path)
    return paths


def load_dir(directory: Path) -> dict[str, JSON]:
    """The dashboards in a directory, by file stem (what `dashboards push` uploads)."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
