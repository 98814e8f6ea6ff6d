"""Where the headline's gain comes from: the baseline turned into Sentinel one lever at a time.

The decomposition starts from the baseline model (a fleet without Sentinel) and changes one
lever at a time, cumulatively, in `LEVERS`' order: the checkpoint interval (the baseline's fixed
hourly one → Young/Daly), hot spares (none: a node replaced by hand → Sentinel's pool),
detection (the job timeout → Sentinel's measured times) and repair (today's restart → each
class's path with Sentinel's times at the fleet's size). Each row is a full simulation of the
cumulative model on the same failures (the fleet's seeds); its gain is its ratio less the row
above's, so the gains add up to Sentinel's ratio less the baseline's. The last row *is*
Sentinel's model: a field on which the two models differ and no lever names fails
`decompose` instead of hiding inside a row.

The order puts what a fleet can have without Sentinel first (a better interval, spares), so
that Sentinel's own rows (detection, repair) are what it adds to a fleet already run well. A
lever's gain depends on the ones above it (the hourly interval costs the baseline far more than
Sentinel's model, on whose live path most failures roll nothing back), so a row says what its
step adds on top of those, not what the lever is worth alone; the one-knob table (`levers.py`)
says what turning one knob back costs Sentinel's model.

The repair step carries more than one field: each class's path (live, warm restart) with the
live path's spec, and the full-stop repair times. Through the paths it moves the Young/Daly
interval too, which follows only the failures that still roll back (the live path's do not):
the row says so.

Which decomposition: the headline's, the two models it compares at its size (`--gpus`) and on
its paths (`--recovery`). The paths side by side at 16,384 and 100,000 GPUs are one ratio each
against the same baseline; `--gpus 100000` or `--recovery restart` decomposes one of those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sentinel.lab.goodput.model import RecoveryModel, RepairPath
from sentinel.lab.goodput.simulate import Fleet, Summary
from sentinel.lab.goodput.trace import FaultClass

Describe = Callable[[Summary], str]


def _interval(s: Summary) -> str:
    rule = "fixed" if s.model.checkpoint_interval_s is not None else "Young/Daly"
    return f"{rule} {s.interval_s:.0f} s"


def _spares(s: Summary) -> str:
    m = s.model
    return (
        f"{m.spares} hot spares" if m.spares else f"none ({m.manual_replace_s / 60:g} min by hand)"
    )


def _detection(s: Summary) -> str:
    times = s.model.detect_s
    if len(set(times.values())) == 1:
        return f"{next(iter(times.values())):g} s every class"
    return ", ".join(f"{cls} {t:.3g} s" for cls, t in times.items())


def _seconds(times: list[float]) -> str:
    low, high = min(times), max(times)
    return f"{low:.0f} s" if round(low) == round(high) else f"{low:.0f}-{high:.0f} s"


def _repair(s: Summary) -> str:
    """Each path with its classes, and a full stop's repair time where the path has one."""
    m = s.model
    by_path: dict[RepairPath, list[FaultClass]] = {}
    for cls in m.detect_s:
        by_path.setdefault(m.path_of(cls), []).append(cls)
    parts = []
    for path, classes in by_path.items():
        named = "every class" if len(classes) == len(m.detect_s) else ", ".join(classes)
        if path != RepairPath.LIVE:
            named += f" ({_seconds([m.resume_s[c] for c in classes])})"
        parts.append(f"{path.replace('_', ' ')}: {named}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Lever:
    name: str
    fields: tuple[str, ...]  # the `RecoveryModel` fields the step takes from Sentinel's model
    describe: Describe  # the lever's setting in a model, as a person reads it


LEVERS = (
    Lever("checkpoint interval", ("checkpoint_interval_s",), _interval),
    Lever("hot spares", ("spares",), _spares),
    Lever("detection", ("detect_s",), _detection),
    Lever("repair", ("resume_s", "path", "live"), _repair),
)
# Fields that name a model or say where its times came from; no simulation reads them.
LABELS = frozenset({"name", "sources"})


@dataclass(frozen=True)
class Step:
    lever: str  # "baseline" for the first row, then each lever's name
    change: str  # the baseline's settings; then what the step changed, from → to
    summary: Summary  # the cumulative model, simulated in full
    gain: float  # its ratio less the row above's (0 for the baseline)


def unnamed_differences(baseline: RecoveryModel, sentinel: RecoveryModel) -> list[str]:
    """The fields on which the two models differ and that no lever changes."""
    named = {f for lever in LEVERS for f in lever.fields} | LABELS
    return [
        f.name
        for f in dataclasses.fields(RecoveryModel)
        if f.name not in named and getattr(baseline, f.name) != getattr(sentinel, f.name)
    ]


def decompose(fleet: Fleet, baseline: RecoveryModel, sentinel: RecoveryModel) -> list[Step]:
    """The baseline, then each lever of `LEVERS` turned to Sentinel's setting on top of the
    ones before; the last row is Sentinel's model."""
    if unnamed := unnamed_differences(baseline, sentinel):
        raise ValueError(f"the models differ in {', '.join(unnamed)}, which no lever changes")
    first = fleet.evaluate(baseline)
    settings = "; ".join(f"{lever.name} {lever.describe(first)}" for lever in LEVERS)
    steps = [Step("baseline", settings, first, 0.0)]
    model = baseline
    for lever in LEVERS:
        model = model.replace(
            name=f"{model.name} + {lever.name}", **{f: getattr(sentinel, f) for f in lever.fields}
        )
        before, after = steps[-1].summary, fleet.evaluate(model)
        change = f"{lever.describe(before)} → {lever.describe(after)}"
        if "checkpoint_interval_s" not in lever.fields and after.interval_s != before.interval_s:
            change += (
                f"; the interval, over the failures that still roll back: {before.interval_s:.0f}"
                f" s → {after.interval_s:.0f} s"
            )
        steps.append(Step(lever.name, change, after, after.mean - before.mean))
    return steps


def decomposition_dict(steps: list[Step]) -> list[dict[str, Any]]:
    return [
        {
            "lever": s.lever,
            "change": s.change,
            "ratio_mean": s.summary.mean,
            "ratio_stdev": s.summary.stdev,
            "gain": s.gain,
            "checkpoint_interval_s": s.summary.interval_s,
        }
        for s in steps
    ]


def render_decomposition(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as text: the ratio and gain first, so a long setting does not push them off."""
    lines = [
        "where the gain comes from: the baseline, then one lever at a time on the same failures",
        f"  {'ratio':>7}{'gain':>10}  step",
        f"  {100 * rows[0]['ratio_mean']:6.2f}%{'':>10}  baseline (no Sentinel): "
        + rows[0]["change"],
    ]
    for r in rows[1:]:
        lines.append(
            f"  {100 * r['ratio_mean']:6.2f}%{100 * r['gain']:+9.2f}p  + {r['lever']}: "
            + r["change"]
        )
    total = sum(r["gain"] for r in rows)
    lines.append(f"  {100 * rows[-1]['ratio_mean']:6.2f}%{100 * total:+9.2f}p  = sentinel")
    return lines
