"""What the demo hands to the report: the result JSON plus the raw series behind the plots.

This is the contract between `sentinel demo` (which records) and `sentinel.lab.demo.report`
(which draws); both sides only read these frozen records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sentinel.lab.demo.result import Generation

TIMELINE_KINDS = ("fault", "detect", "incident", "action", "resume", "burnin", "info")


@dataclass(frozen=True)
class StepPoint:
    """The global loss of one optimizer step; `t` is seconds since the demo started."""

    step: int
    loss: float
    generation: int
    t: float


@dataclass(frozen=True)
class RankSample:
    """One rank's wall time for one step, and its model FLOPs utilisation when known. `step` is
    numbered as the trainer's metrics are (the hooks' step s is the trainer's step s + 1);
    `generation` is the supervisor's generation that ran it, `t` when it was reported (demo
    seconds). A step trained, rolled back and trained again has one sample per generation."""

    rank: int
    step: int
    step_s: float
    mfu: float | None
    generation: int = 0
    t: float = 0.0


@dataclass(frozen=True)
class TimelineEntry:
    """One thing that happened; `kind` is one of `TIMELINE_KINDS`. `step` is the training step
    in progress when it happened; `ref` names what it is about (`fault:INDEX` in the
    scenario's fault list, `incident:ID`), so the report can give it the result's own step."""

    t: float
    step: int | None
    kind: str
    target: str | None
    text: str
    ref: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in TIMELINE_KINDS:
            raise ValueError(
                f"timeline kind {self.kind!r} is not one of {', '.join(TIMELINE_KINDS)}"
            )


@dataclass(frozen=True)
class DemoData:
    """Everything the report draws. `result` is the demo JSON of DESIGN.md; in its `faults`,
    `time_to_detect_s` runs from injection to detection and `time_to_resume_s` from detection
    to the first resumed step. `summary` replaces the derived one-line summary.
    `generations` are the gang's launches (the supervisor's log): node K of a generation's
    nodes hosted its ranks K * `gpus_per_node` onwards. `checkpoints` are the steps saved."""

    result: dict[str, Any]
    steps: list[StepPoint]
    reference_steps: list[StepPoint]
    ranks: list[RankSample]
    burnin: dict[str, Any] | None
    timeline: list[TimelineEntry]
    summary: str | None = None
    generations: list[Generation] = field(default_factory=list)
    gpus_per_node: int = 1
    checkpoints: list[int] = field(default_factory=list)
