"""What the supervisor keeps of its job: the node map, the generation, and what the next
generation resumes from; and how a repair plan changes them.

`JobRecord.apply_restart` is a restart of every rank (warm or cold): new node map, the
checkpoint to resume from, skip ranges and a learning-rate scale for the trainer.
`JobRecord.swap_nodes` is the node map's part alone: a live repair, where only the struck
replica rejoins, from a live peer, and nothing is resumed from a checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sentinel.protocol import JobState, RepairPlan

_CKPT = re.compile(r"step[-_]?(\d+)")
# A job whose replicas are fault domains writes each replica's checkpoints under its own
# directory (the reference trainer's `--replicas ft`: CKPT/replica-R/step-N).
_REPLICA_DIR = re.compile(r"replica-\d+")


class GangError(RuntimeError):
    """A restart plan that cannot form the gang at its size (a node out with no spare in)."""


@dataclass
class JobRecord:
    nodes: list[str]
    spares: list[str]
    gpus_per_node: int
    generation: int = 0
    state: JobState = JobState.STARTING
    resume_from: str | None = None
    resume_step: int | None = None  # the step of `resume_from`
    skip: list[tuple[int, int]] = field(default_factory=list)
    lr_scale: tuple[float, int] | None = None
    seen_commands: set[str] = field(default_factory=set)

    def swap_nodes(self, plan: RepairPlan) -> list[str]:
        """The plan's node map: excluded nodes out, each with its spare in its place (GangError,
        changing nothing, when one has none); returns the nodes that left the job."""
        spare_map, excluded = plan.spare_map, set(plan.exclude)
        new_nodes = []
        for node in self.nodes:
            if node in excluded or node in spare_map:
                if node in spare_map:
                    new_nodes.append(spare_map[node])
                continue
            new_nodes.append(node)
        if len(new_nodes) < len(self.nodes):
            out = sorted(n for n in self.nodes if n in excluded and n not in spare_map)
            raise GangError(
                f"the restart plan takes {', '.join(out)} out with no spare in its place:"
                f" {len(new_nodes)} of {len(self.nodes)} nodes left, the gang cannot be formed"
            )
        left = [n for n in self.nodes if n not in new_nodes]
        self.spares = [s for s in self.spares if s not in spare_map.values()]
        self.nodes = new_nodes
        return left

    def apply_restart(
        self, plan: RepairPlan | dict[str, object], checkpoints: dict[int, Path]
    ) -> list[str]:
        """A restart of every rank by the plan; returns the nodes that left the job."""
        if not isinstance(plan, RepairPlan):
            plan = RepairPlan.model_validate(plan)
        left = self.swap_nodes(plan)
        before = plan.resume_before_step
        eligible = [s for s in checkpoints if before is None or s <= before]
        self.resume_step = max(eligible, default=None)
        self.resume_from = None if self.resume_step is None else str(checkpoints[self.resume_step])
        for lo, hi in plan.skip_batches:
            if (lo, hi) not in self.skip:
                self.skip.append((lo, hi))
        lr = plan.lr_scale
        self.lr_scale = (lr.factor, lr.steps) if lr else None
        self.generation += 1
        return left

    def trainer_flags(self, resume: bool = True) -> list[str]:
        """The plan's flags for the trainer; `resume=False`: a replica that rejoins heals from a
        live peer (`--ft-heal`), so it is told neither to read a checkpoint nor to start a
        learning-rate window (the peer's schedule, window and all, comes with its state)."""
        flags = [] if resume else ["--ft-heal"]
        if self.resume_from and resume:
            flags += ["--resume-from", self.resume_from]
        if self.skip:
            flags += ["--skip-batches", ",".join(f"{lo}-{hi}" for lo, hi in self.skip)]
        if self.lr_scale and resume:
            flags += ["--lr-scale", f"{self.lr_scale[0]:g}:{self.lr_scale[1]}"]
        return flags


def find_checkpoints(directory: Path | None, marker: str = "COMMITTED") -> dict[int, Path]:
    """Complete checkpoints by step: `step_N*` / `step-N*` files, or directories holding the
    commit marker, in `directory` or in its `replica-R` directories (any replica's copy of a
    step will do: the replicas hold the same state). Half-written ones (`*.tmp`, a directory
    without the marker) are skipped."""
    if directory is None or not directory.is_dir():
        return {}
    found: dict[int, Path] = {}
    for path in sorted(directory.iterdir()):
        if path.is_dir() and _REPLICA_DIR.fullmatch(path.name):
            for step, copy in find_checkpoints(path, marker).items():
                found.setdefault(step, copy)
            continue
        m = _CKPT.fullmatch(path.stem) or _CKPT.fullmatch(path.name)
        if m is None or path.name.endswith(".tmp"):
            continue
        if path.is_dir() and not (path / marker).exists():
            continue
        found[int(m.group(1))] = path
    return found


def initial_job(
    nodes: int,
    spares: int,
    gpus_per_node: int,
    exclude: frozenset[str],
    given: list[str] | None = None,
) -> JobRecord:
    """The first node map: excluded nodes (a burn-in's exclude list) give their place to spares,
    in order; with too few spares the job cannot start at its size. `given`: the launcher's
    node names (gang first, then spares), else the simulated fleet's `node-K` and `spare-K`."""
    if given is None:
        given = [f"node-{i}" for i in range(nodes)] + [f"spare-{i}" for i in range(spares)]
    names = given[:nodes]
    free = [s for s in given[nodes : nodes + spares] if s not in exclude]
    placed = []
    for name in names:
        if name not in exclude:
            placed.append(name)
        elif free:
            placed.append(free.pop(0))
        else:
            raise ValueError(
                f"{name} is excluded and no spare is left to take its place "
                f"({spares} spare(s) for {len(set(names) & exclude)} excluded node(s))"
            )
    return JobRecord(nodes=placed, spares=free, gpus_per_node=gpus_per_node)
