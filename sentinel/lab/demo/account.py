"""Where a drill's wall time went: every second from the demo's start to its last training step,
in exactly one category, so the categories add up to the wall time.

- `productive`: training steps whose result the run kept;
- `rollback`: steps trained and then thrown away by a rollback (replayed later);
- `detection`: the run stood still with a fault not yet detected (a hang before its watchdog
  fired; a fault that lets training go on costs `rollback` instead);
- `repair`: from detection (or from the last step, when training went on past it) to the first
  step of the new generation, in stages: `stop` (the playbook deciding, stopping the gang,
  evicting, swapping), `relaunch` (the new processes starting), `rendezvous`,
  `checkpoint_load`, `build` (the model, data and hooks before the first step);
- `checkpoint`: training held up by checkpoint saves;
- `burnin`: the burn-in before launch;
- `startup`: the coordinator, agents and the first launch up to its first step.

The effective training time ratio is `productive` over the wall time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sentinel.lab.sim.inject import CheckpointSave, Launch, StepLine

CATEGORIES = ("productive", "rollback", "detection", "repair", "checkpoint", "burnin", "startup")
REPAIR_STAGES = ("stop", "relaunch", "rendezvous", "checkpoint_load", "build")


@dataclass(frozen=True)
class Launched:
    """A generation the supervisor launched (demo seconds) and its rank 0's start-up report."""

    t: float
    number: int
    launch: Launch | None


@dataclass
class Ledger:
    """Seconds by category and repair stage, written in time order from a moving cursor: a
    piece ending before the cursor counts nothing, so no second is counted twice."""

    cursor: float = 0.0
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    stages: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def until(self, t: float, category: str, stage: str | None = None) -> None:
        if t <= self.cursor:
            return
        self.seconds[category] += t - self.cursor
        if stage is not None:
            self.stages[stage] += t - self.cursor
        self.cursor = t


def match_launches(
    starts: Sequence[tuple[float, int]], launches: Sequence[Launch]
) -> list[Launched]:
    """Pair each generation the supervisor launched with the start-up report that came after it
    (a generation that died before reporting has none)."""
    out = []
    for i, (t, number) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else float("inf")
        mine = next((la for la in launches if t <= la.main_t < end), None)
        out.append(Launched(t=t, number=number, launch=mine))
    return out


def _start_up(ledger: Ledger, gen: Launched, category: str) -> None:
    """From the launch to the first step: processes, rendezvous, checkpoint load, build."""
    la = gen.launch
    stage = category == "repair"
    if la is None:
        return
    ledger.until(la.main_t, category, "relaunch" if stage else None)
    ledger.until(la.main_t + la.rendezvous_s, category, "rendezvous" if stage else None)
    ready = la.ready_t
    load_end = min(ready, ledger.cursor + la.load_s)
    ledger.until(load_end, category, "checkpoint_load" if stage else None)
    ledger.until(ready, category, "build" if stage else None)


def _steps(
    ledger: Ledger, lines: Sequence[StepLine], kept: set[int], saves: dict[int, float]
) -> None:
    """Each line closes its step: the time since the previous boundary is that step's, less
    what it waited on checkpoints (its staging wait, the save after the previous step)."""
    prev_step: int | None = None
    for i, line in enumerate(lines):
        held = line.ckpt_stall_s + (saves.get(prev_step, 0.0) if prev_step is not None else 0.0)
        ledger.until(max(ledger.cursor, line.t - held), "productive" if i in kept else "rollback")
        ledger.until(line.t, "checkpoint")
        prev_step = line.step


def time_account(
    lines: Sequence[tuple[StepLine, int]],
    starts: Sequence[tuple[float, int]],
    launches: Sequence[Launch],
    saves: Sequence[CheckpointSave],
    detections: Sequence[float],
    burnin: tuple[float, float] | None,
) -> dict[str, Any]:
    """The drill's time account. `lines` are (line, index in `starts`) in the order seen;
    `starts` are (demo time, generation number) of each launch; `detections` the demo times
    incidents opened; `burnin` its (start, end)."""
    ledger = Ledger()
    gens = match_launches(starts, launches)
    if burnin is not None:
        ledger.until(burnin[0], "startup")
        ledger.until(burnin[1], "burnin")
    last_of_step = {line.step: i for i, (line, _g) in enumerate(lines)}  # the kept training
    kept = set(last_of_step.values())
    held = {s.step: s.held_s for s in saves}
    for k, gen in enumerate(gens):
        mine = [(i, ln) for i, (ln, g) in enumerate(lines) if g == k]
        if k > 0:
            ledger.until(gen.t, "repair", "stop")
        else:
            ledger.until(gen.t, "startup")
        _start_up(ledger, gen, "repair" if k > 0 else "startup")
        index = {i: j for j, (i, _ln) in enumerate(mine)}
        _steps(ledger, [ln for _i, ln in mine], {index[i] for i in kept if i in index}, held)
        if k + 1 < len(gens):
            nxt = gens[k + 1].t
            found = [d for d in detections if ledger.cursor < d <= nxt]
            if found:
                ledger.until(min(found), "detection")
    wall = ledger.cursor
    seconds = {c: round(ledger.seconds.get(c, 0.0), 3) for c in CATEGORIES}
    return {
        "wall_s": round(wall, 3),
        "seconds": seconds,
        "repair_stages_s": {s: round(ledger.stages.get(s, 0.0), 3) for s in REPAIR_STAGES},
        "effective_ratio": round(seconds["productive"] / wall, 4) if wall > 0 else None,
    }
