"""A drill's own times on the reference fleet, decomposed lever by lever: what `sentinel goodput
--from-demo DIR/goodput.json` prints under "where the gain comes from", for the drill's report.

The drill's measured detection and resume per fault class replace the shipped measurements'
(as `--from-demo` does: a resume is taken whole at any size); everything else is the command's
defaults: Llama 3's trace on its 16,384 GPUs for its 54 days, spares by the rule, each fault on
the catalog's path, Young/Daly saves, `RUNS` seeds from 0. A test holds it to the command's.
"""

from __future__ import annotations

from typing import Any

from sentinel.lab.goodput.compare import rule_spares
from sentinel.lab.goodput.decompose import decompose, decomposition_dict
from sentinel.lab.goodput.inputs import Plan, build_models, default_rows, with_drill_times
from sentinel.lab.goodput.measurements import read_measurements
from sentinel.lab.goodput.model import demo_times
from sentinel.lab.goodput.simulate import Fleet
from sentinel.lab.goodput.trace import LLAMA3

RUNS = 10  # `sentinel goodput --runs`' default


def drill_projection(times: dict[str, dict[str, float]], path: str) -> dict[str, Any]:
    """The decomposition with the drill's `times` (its goodput.json, written to `path`)."""
    detect, resume = demo_times(times, path)
    measurements, where = read_measurements()
    rows = with_drill_times(default_rows(measurements, where), detect, resume, path)
    values = {r.key: r.value for r in rows}
    gpus = LLAMA3.gpus
    plan = Plan(gpus, rule_spares(LLAMA3, gpus, values), interval_s=None, asynchronous=True)
    sentinel, baseline, _spec = build_models(values, plan)
    fleet = Fleet(LLAMA3, gpus=gpus, days=LLAMA3.days, seeds=list(range(RUNS)))
    return {
        "command": f"sentinel goodput --from-demo {path}",
        "trace": LLAMA3.name,
        "gpus": gpus,
        "days": LLAMA3.days,
        "runs": RUNS,
        "measurements": where,
        "drill_classes": sorted({*map(str, detect), *map(str, resume)}),
        "decomposition": decomposition_dict(decompose(fleet, baseline, sentinel)),
    }
