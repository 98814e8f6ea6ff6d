"""Sentinel's Grafana dashboards, kept as data (one `Panel` row per panel, see `panels`) so the
committed JSON is reproducible.

`python -m sentinel.dashboards [DIR]` writes them (default: `dashboards/` at the repository root);
a test checks the committed files equal what the specs render to.
"""

from __future__ import annotations

import json
from pathlib import Path

from sentinel.dashboards import burn_in, fleet_health, incidents, training_run
from sentinel.dashboards.panels import JSON, Spec
from sentinel.dashboards.panels import render as render_spec
from sentinel.exitcodes import InputError
from sentinel.inputs import read_json

# File stem -> dashboard. The stem is the file name under dashboards/.
SPECS: dict[str, Spec] = {
    "fleet-health": fleet_health.SPEC,
    "training-run": training_run.SPEC,
    "burn-in": burn_in.SPEC,
    "incidents-playbooks": incidents.SPEC,
}


def build_all() -> dict[str, JSON]:
    return {name: render_spec(spec) for name, spec in SPECS.items()}


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
    if not directory.is_dir():
        raise InputError(f"--dir {directory}: not a directory of dashboards")
    return {
        p.stem: read_json(p, "--dir: a Grafana dashboard") for p in sorted(directory.glob("*.json"))
    }
