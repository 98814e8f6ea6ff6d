"""Scenario files: a simulated fleet, a trainer configuration and the faults to inject.

The fault vocabulary is shared by the GPU simulator, burn-in, the reference trainer's fault
injection and the demo. Only injectors and the drill's own after-the-fact report read a
scenario; detectors never do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sentinel.config import config_errors
from sentinel.exitcodes import InputError
from sentinel.faults.repairs import Recovery, allowed_for_kind, path_for_kind
from sentinel.inputs import parse_yaml, read_text

NodeName = Annotated[str, Field(pattern=r"^(node|spare)-\d+$")]


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EccDbeFault(_Fault):
    kind: Literal["ecc_dbe"]
    node: NodeName
    gpu: int = Field(ge=0)
    at_step: int = Field(ge=0)
    # The GPU stops answering too: the rank on it blocks in its step from `at_step` on, as a
    # process does on a GPU that fell off the bus. Its peers learn of it only in a collective
    # that never completes, unless something ends the rank first.
    stalls: bool = False


class XidFault(_Fault):
    kind: Literal["xid"]
    node: NodeName
    gpu: int = Field(ge=0)
    xid: int = Field(ge=1)
    at_step: int = Field(ge=0)
    stalls: bool = False  # as EccDbeFault's


class ThermalFault(_Fault):
    kind: Literal["thermal"]
    node: NodeName
    gpu: int = Field(ge=0)
    temp_c: float = Field(gt=0, le=150)
    at_step: int = Field(ge=0)


class CorruptBatchFault(_Fault):
    kind: Literal["corrupt_batch"]
    batch: int = Field(ge=0)


class SdcFault(_Fault):
    kind: Literal["sdc"]
    rank: int = Field(ge=0)
    at_step: int = Field(default=0, ge=0)


class StragglerFault(_Fault):
    kind: Literal["straggler"]
    rank: int = Field(ge=0)
    slowdown: float = Field(gt=1.0, le=100.0)
    at_step: int = Field(default=0, ge=0)


class HangFault(_Fault):
    kind: Literal["hang"]
    rank: int = Field(ge=0)
    at_step: int = Field(ge=0)
    # How the rank stops before its next collective: `sleep` (its own threads run on: its
    # watchdog reports it), `sigstop` (stopped by the kernel) or `gil` (a C call that holds the
    # GIL): in the last two its watchdog thread is silenced too, and only the agent's outside
    # watchdog (agent/ranks/watch.py) sees the rank itself.
    how: Literal["sleep", "sigstop", "gil"] = "sleep"


class CrashFault(_Fault):
    kind: Literal["crash"]
    rank: int = Field(ge=0)
    at_step: int = Field(ge=0)
    # A poison crash (a bad batch, a code bug): the rank dies at this step on every run that
    # reaches it, whatever node it runs on, instead of once.
    recurs: bool = False


class LinkDegradedFault(_Fault):
    kind: Literal["link_degraded"]
    node: NodeName
    factor: float = Field(gt=0, lt=1)


class ConfigDriftFault(_Fault):
    """A node whose ranks are given another collective environment than the fleet's (a site
    script that set NCCL_IB_HCA on one node): the burn-in's fingerprint names it before it
    measures anything."""

    kind: Literal["config_drift"]
    node: NodeName
    env: dict[Annotated[str, Field(pattern=r"^(NCCL|FI)_[A-Z0-9_]+$")], str] = Field(
        min_length=1, max_length=16
    )


Fault = Annotated[
    EccDbeFault
    | XidFault
    | ThermalFault
    | CorruptBatchFault
    | SdcFault
    | StragglerFault
    | HangFault
    | CrashFault
    | LinkDegradedFault
    | ConfigDriftFault,
    Field(discriminator="kind"),
]

NODE_FAULTS = (EccDbeFault, XidFault, ThermalFault)
PRELAUNCH_FAULTS = (LinkDegradedFault, ConfigDriftFault)  # the burn-in keeps their nodes out
RANK_FAULTS = (SdcFault, StragglerFault, HangFault, CrashFault)


class FleetSpec(_Fault):
    nodes: int = Field(default=4, ge=1, le=1024)
    gpus_per_node: int = Field(default=2, ge=1, le=16)
    spares: int = Field(default=1, ge=0, le=64)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_names(self) -> list[str]:
        return [f"node-{k}" for k in range(self.nodes)]

    def spare_names(self) -> list[str]:
        return [f"spare-{k}" for k in range(self.spares)]

    def node_of_rank(self, rank: int) -> str:
        """The node hosting `rank` in the initial mapping (DESIGN.md)."""
        return f"node-{rank // self.gpus_per_node}"


class TrainerSpec(_Fault):
    tp: int = Field(default=2, ge=1)
    pp: int = Field(default=2, ge=1)
    dp: int = Field(default=2, ge=1)
    steps: int = Field(default=120, ge=1)
    checkpoint_every: int = Field(default=20, ge=1)
    seed: int = 7


class ReturnDrill(_Fault):
    """An operator returns the node a fault's repair evicted (validation before return): first
    while its GPU is still damaged (`damage`, written into that simulated GPU when the fault
    strikes: silent in every NVML reading, only the validation burn-in sees it), which
    validation must refuse; then, once repaired (`clear`), again, which must pass."""

    node: NodeName
    gpu: int = Field(default=0, ge=0)
    damage: list[Literal["sdc", "slow"]] = Field(default=["sdc"], min_length=1)
    slowdown: float = Field(default=4.0, gt=1, le=100)  # for `slow`


class Scenario(_Fault):
    name: str = "custom"
    description: str = ""
    fleet: FleetSpec = FleetSpec()
    trainer: TrainerSpec = TrainerSpec()
    faults: list[Fault] = Field(default_factory=list)
    returns: ReturnDrill | None = None
    # The repair path for every fault (sentinel.faults.repairs); None: each fault's own.
    recovery: Recovery | None = None

    @model_validator(mode="after")
    def _faults_fit_the_fleet(self) -> Scenario:
        problems = self.problems()
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def problems(self) -> list[str]:
        """Every way the trainer and the faults do not fit the fleet, each with its path."""
        world, t = self.fleet.world_size, self.trainer
        out = []
        if t.tp * t.pp * t.dp != world:
            out.append(
                f"trainer: tp*pp*dp = {t.tp * t.pp * t.dp} must equal the fleet's GPUs "
                f"({self.fleet.nodes} nodes x {self.fleet.gpus_per_node} = {world})"
            )
        names = set(self.fleet.node_names()) | set(self.fleet.spare_names())
        for i, f in enumerate(self.faults):
            node, gpu, rank = (getattr(f, k, None) for k in ("node", "gpu", "rank"))
            if node is not None and node not in names:
                out.append(f"faults.{i}.node: {node} is not in the fleet")
            if gpu is not None and gpu >= self.fleet.gpus_per_node:
                out.append(f"faults.{i}.gpu: {gpu} >= gpus_per_node ({self.fleet.gpus_per_node})")
            if rank is not None and rank >= world:
                out.append(f"faults.{i}.rank: {rank} >= world size {world}")
            field = "batch" if isinstance(f, CorruptBatchFault) else "at_step"
            step = getattr(f, field, None)
            if step is not None and step >= t.steps:
                out.append(
                    f"faults.{i}.{field}: {step} is past the run's last step ({t.steps - 1}):"
                    " the fault would never strike"
                )
        if self.recovery == Recovery.LIVE and t.dp < 2:
            out.append("recovery: live needs data-parallel replicas (trainer.dp >= 2)")
        if self.runs_replicas and self.fleet.nodes % t.dp:
            out.append(
                f"trainer: dp {t.dp} replicas as fault domains cannot split "
                f"{self.fleet.nodes} nodes evenly"
            )
        if self.recovery is not None:
            for i, f in enumerate(self.faults):
                allowed, why = allowed_for_kind(f.kind)
                if self.recovery not in allowed:
                    paths = ", ".join(p.value for p in Recovery if p in allowed)
                    out.append(
                        f"recovery: {self.recovery.value} is not a path for faults.{i} "
                        f"({f.kind}): {why}; it allows {paths}"
                    )
        if self.returns is not None:
            if self.returns.node not in names:
                out.append(f"returns.node: {self.returns.node} is not in the fleet")
            if self.returns.gpu >= self.fleet.gpus_per_node:
                out.append(
                    f"returns.gpu: {self.returns.gpu} >= gpus_per_node ({self.fleet.gpus_per_node})"
                )
        return out

    @property
    def runs_replicas(self) -> bool:
        """Its data-parallel replicas are fault domains (the trainer's replica mode), so that a
        fault confined to one can take the live path: with `recovery: live`, or with none when
        any fault's own path is live (and there are replicas: dp >= 2)."""
        if self.trainer.dp < 2:
            return False
        if self.recovery is not None:
            return self.recovery == Recovery.LIVE
        during = [f for f in self.faults if not isinstance(f, LinkDegradedFault)]  # burn-in's
        return any(path_for_kind(f.kind) == Recovery.LIVE for f in during)

    def faults_of(self, *kinds: type[_Fault]) -> list[_Fault]:
        return [f for f in self.faults if isinstance(f, kinds)]


SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


def resolve_scenario_path(name_or_file: str) -> Path:
    """A path, or the name of a shipped scenario (`scenarios/NAME.yaml`)."""
    p = Path(name_or_file)
    if p.exists():
        return p
    shipped = SCENARIO_DIR / f"{name_or_file}.yaml"
    if shipped.exists():
        return shipped
    raise InputError(
        f"no scenario file or shipped scenario named {name_or_file!r}; shipped: "
        + ", ".join(shipped_scenarios())
    )


def shipped_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(name_or_file: str | Path) -> Scenario:
    path = resolve_scenario_path(str(name_or_file))
    doc = parse_yaml(read_text(path), str(path))
    if doc is None:
        raise InputError(f"{path}: empty: a scenario is a mapping with fleet, trainer and faults")
    if not isinstance(doc, dict):
        raise InputError(f"{path}: a scenario is a mapping with fleet, trainer and faults")
    doc.setdefault("name", path.stem)
    try:
        return Scenario.model_validate(doc)
    except ValidationError as e:
        raise InputError(f"{path}: invalid scenario:\n  " + "\n  ".join(config_errors(e))) from None
