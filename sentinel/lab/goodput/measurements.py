"""Sentinel's measured detection and repair times per fault class, merged from drill runs.

`benchmarks/goodput_measurements.py` runs the shipped drills (or reads their run directories)
and writes one file of this shape; a copy made on the development machine ships as
`sentinel/data/goodput_measurements.json`, and `sentinel goodput` reads it by default.

Every fault a drill timed is one `Sample`. A class's figures (`ClassFigures`) are its samples'
means, recomputed on load: a file whose summary disagrees with its samples is refused. A class
no drill times (a degraded link is kept out by burn-in before launch, so it has no detection or
resume during training) has no figures and a note saying why; the projection then names what it
uses instead as an assumption.
"""

from __future__ import annotations

import json
import statistics
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sentinel.config import config_errors
from sentinel.exitcodes import InputError
from sentinel.inputs import read_json
from sentinel.lab.goodput.trace import FaultClass

FORMAT = "sentinel-goodput-measurements/1"
SHIPPED = "goodput_measurements.json"  # in sentinel/data/
LINK_NOTE = (
    "not measured: burn-in keeps a degraded link out before launch (drill {scenarios}), so no "
    "drill has a detection or resume during training to time"
)
NO_SAMPLE_NOTE = "not measured: no drill in this file timed a fault of this class"


Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Drill(_Strict):
    """One drill run the samples came from."""

    scenario: str = Field(min_length=1)
    fleet: str = Field(min_length=1)  # "local" (simulated fleet) or "slurm"
    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    spares: int = Field(ge=0)
    layout: str  # "tp2 pp2 dp2"
    steps: int = Field(gt=0)  # steps the drill trained (a --quick drill trains fewer)
    compression: int = Field(gt=0)  # the drill's time compression (docs/drills.md)
    verdict: Literal["pass", "fail"]
    burnin_kept_out: list[str] = []  # fault kinds burn-in excluded before launch


class Sample(_Strict):
    """One fault a drill injected and timed."""

    kind: str = Field(min_length=1)  # the drill's fault kind (ecc_dbe, crash, ...)
    fault_class: FaultClass
    drill: int = Field(ge=0)  # index into `drills`
    detect_s: float | None = Field(default=None, ge=0)  # strike -> incident opened
    repair_s: float | None = Field(default=None, ge=0)  # incident opened -> training resumed
    detect_steps: int | None = None  # steps from the strike to the detection, in drill steps
    watchdog_timeout_s: float | None = Field(default=None, gt=0)  # hang: the timeout reached
    # The coordinator's recorded repair by segment (decide, drain, prepare, relaunch, rendezvous,
    # checkpoint_load, build_first_step: `sentinel.coordinator.core.stages.SEGMENTS`), in seconds.
    stages_s: dict[str, Seconds] = {}


class ClassFigures(_Strict):
    """A class's means over its samples; None where no sample has the figure."""

    samples: int = Field(ge=0)
    detect_s: float | None = None
    repair_s: float | None = None
    # hang: detection past the watchdog's timeout (what the drill's time compression leaves
    # alone); sdc: steps from the strike to the detection at the shipped settings (drill steps
    # x compression).
    past_watchdog_s: float | None = None
    detect_steps_shipped: float | None = None
    scenarios: list[str] = []
    note: str | None = None
    stages_s: dict[str, float] = {}  # each repair segment's mean over the samples that have it


class Measurements(_Strict):
    format: Literal["sentinel-goodput-measurements/1"]
    date: str = Field(min_length=1)
    command: str = Field(min_length=1)
    machine: str = Field(min_length=1)
    drills: list[Drill] = Field(min_length=1)
    samples: list[Sample]
    classes: dict[FaultClass, ClassFigures]

    @model_validator(mode="after")
    def _consistent(self) -> Measurements:
        problems = [
            f"samples.{i}.drill: no drill {s.drill} (there are {len(self.drills)})"
            for i, s in enumerate(self.samples)
            if s.drill >= len(self.drills)
        ]
        if not problems:
            problems = _summary_mismatches(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 2) if values else None


def summarise(drills: list[Drill], samples: list[Sample]) -> dict[FaultClass, ClassFigures]:
    """Each class's figures: means over its samples, the drills they came from, and a note for
    a class with no sample."""
    out: dict[FaultClass, ClassFigures] = {}
    for cls in FaultClass:
        mine = [s for s in samples if s.fault_class == cls]
        scen = sorted({f"{drills[s.drill].scenario} ({drills[s.drill].fleet})" for s in mine})
        past = [
            s.detect_s - s.watchdog_timeout_s
            for s in mine
            if s.detect_s is not None and s.watchdog_timeout_s is not None
        ]
        steps = [
            float(s.detect_steps * drills[s.drill].compression)
            for s in mine
            if s.detect_steps is not None
        ]
        out[cls] = ClassFigures(
            samples=len(mine),
            detect_s=_mean([s.detect_s for s in mine if s.detect_s is not None]),
            repair_s=_mean([s.repair_s for s in mine if s.repair_s is not None]),
            past_watchdog_s=_mean(past) if cls == FaultClass.HANG else None,
            detect_steps_shipped=_mean(steps) if cls == FaultClass.SDC else None,
            scenarios=scen,
            note=None if mine else _no_sample_note(cls, drills),
            stages_s=_stage_means(mine),
        )
    return out


def _stage_means(samples: list[Sample]) -> dict[str, float]:
    names = list(dict.fromkeys(name for s in samples for name in s.stages_s))
    return {
        name: _mean([s.stages_s[name] for s in samples if name in s.stages_s]) or 0.0
        for name in names
    }


def _no_sample_note(cls: FaultClass, drills: list[Drill]) -> str:
    kept = sorted({d.scenario for d in drills if "link_degraded" in d.burnin_kept_out})
    if cls == FaultClass.LINK and kept:
        return LINK_NOTE.format(scenarios=", ".join(kept))
    return NO_SAMPLE_NOTE


def _summary_mismatches(m: Measurements) -> list[str]:
    expected = summarise(m.drills, m.samples)
    out = []
    for cls in FaultClass:
        got = m.classes.get(cls)
        if got is None:
            out.append(f"classes.{cls}: missing (every class is listed, with a note if unmeasured)")
            continue
        want = expected[cls].model_dump()
        for key, value in got.model_dump().items():
            if key != "note" and value != want[key]:
                out.append(
                    f"classes.{cls}.{key}: {value!r} does not match its samples ({want[key]!r})"
                )
    return out


def read_measurements(path: Path | None = None) -> tuple[Measurements, str]:
    """The measurements at `path`, or the shipped ones; with where they came from (the shipped
    copy by its path in the repository, wherever the package is installed)."""
    if path is None:
        text = files("sentinel").joinpath("data", SHIPPED).read_text()
        where = f"sentinel/data/{SHIPPED}"
        return parse_measurements(json.loads(text), where), where
    data = read_json(path, "a measurements file: benchmarks/goodput_measurements.py --out")
    return parse_measurements(data, str(path)), str(path)


def parse_measurements(data: Any, source: str) -> Measurements:
    try:
        return Measurements.model_validate(data)
    except ValidationError as e:
        lines = "\n  ".join(config_errors(e))
        raise InputError(f"{source}: invalid goodput measurements:\n  {lines}") from None


def dump(m: Measurements) -> str:
    return json.dumps(m.model_dump(mode="json"), indent=2) + "\n"
