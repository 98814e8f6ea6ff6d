"""From drill run directories (`sentinel demo --out DIR`) to goodput measurement samples.

A drill's `result.json` times each fault it injected (`time_to_detect_s` from the strike to
the incident, `time_to_resume_s` from the incident to the first step trained after the repair,
`repair_stages_s` the coordinator's recorded repair by segment)
and its `scenario.yaml` is the scenario as run (shortened by `--quick`). Only what the drill
measured is taken: a fault it did not detect gives no detection time, one it did not repair
no repair time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sentinel.exitcodes import InputError
from sentinel.inputs import read_json
from sentinel.lab.demo.result import HANG_SLACK_S
from sentinel.lab.goodput.measurements import Drill, Sample
from sentinel.lab.goodput.model import DEMO_KIND_CLASS
from sentinel.scenario import Scenario, load_scenario

HANG_TARGET = "detected within the watchdog timeout + 10 s"


def read_run(run_dir: Path) -> tuple[dict[str, Any], Scenario]:
    """A drill's result and the scenario it ran."""
    result = read_json(run_dir / "result.json", "a drill's --out directory?")
    return result, load_scenario(run_dir / "scenario.yaml")


def drill_of(result: dict[str, Any], scenario: Scenario) -> Drill:
    t = scenario.trainer
    settings = result.get("drill_settings") or {}
    if "compression" not in settings:
        raise InputError(f"drill {result.get('scenario')}: result.json has no drill_settings")
    return Drill(
        scenario=str(result["scenario"]),
        fleet=str(result.get("fleet", "local")),
        nodes=scenario.fleet.nodes,
        gpus_per_node=scenario.fleet.gpus_per_node,
        spares=scenario.fleet.spares,
        layout=f"tp{t.tp} pp{t.pp} dp{t.dp}",
        steps=t.steps,
        compression=int(settings["compression"]),
        verdict=result["verdict"],
        burnin_kept_out=sorted(
            {f["kind"] for f in result["faults"] if "burnin.exclude" in f.get("actions", [])}
        ),
    )


def _watchdog_timeout(fault: dict[str, Any]) -> float | None:
    limit = next((t["limit"] for t in fault.get("targets", []) if t["target"] == HANG_TARGET), None)
    return None if limit is None else float(limit) - HANG_SLACK_S


def samples_of(result: dict[str, Any], drill_index: int) -> list[Sample]:
    """One sample per fault the drill detected during training (burn-in catches have no time)."""
    out = []
    for f in result["faults"]:
        cls = DEMO_KIND_CLASS.get(f["kind"])
        if cls is None or not f["detected"] or f["time_to_detect_s"] is None:
            continue
        steps = (
            f["detected_step"] - f["injected_step"]
            if f["detected_step"] is not None and f["injected_step"] is not None
            else None
        )
        out.append(
            Sample(
                kind=f["kind"],
                fault_class=cls,
                drill=drill_index,
                detect_s=f["time_to_detect_s"],
                repair_s=f["time_to_resume_s"] if f.get("repaired") else None,
                detect_steps=steps,
                watchdog_timeout_s=_watchdog_timeout(f) if f["kind"] == "hang" else None,
                stages_s=f.get("repair_stages_s") or {} if f.get("repaired") else {},
            )
        )
    return out
