"""Failure traces: root-cause categories with counts over a window on a fleet of a given size.

A trace file (YAML or JSON) looks like the built-in reference:

    name: my-cluster
    gpus: 16384
    days: 54
    categories:
      - {name: Faulty GPU, count: 148, fault_class: node}

`fault_class` says how Sentinel recovers from that cause (see `FaultClass`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sentinel.exitcodes import InputError
from sentinel.inputs import parse_yaml, read_json, read_text


class FaultClass(StrEnum):
    """How a cause is recovered from; each class has its own detection and repair times."""

    NODE = "node"  # hardware: evict the node, swap in a spare, restart from checkpoint
    RESTART = "restart"  # software/transient: restart from checkpoint on the same nodes
    HANG = "hang"  # collective hang: watchdog + flight recorder, then restart
    SDC = "sdc"  # silent data corruption: recompute-diff, evict the node, restart
    LINK = "link"  # network link/switch: evict the node on the bad link, swap in a spare


NEEDS_NODE = frozenset({FaultClass.NODE, FaultClass.SDC, FaultClass.LINK})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Category(_Strict):
    name: str = Field(min_length=1)
    count: int = Field(ge=0)
    fault_class: FaultClass


class Trace(_Strict):
    name: str = Field(min_length=1)
    gpus: int = Field(gt=0)
    days: float = Field(gt=0)
    categories: tuple[Category, ...] = Field(min_length=1)

    @property
    def total(self) -> int:
        return sum(c.count for c in self.categories)

    def counts_by_class(self) -> dict[FaultClass, int]:
        out = dict.fromkeys(FaultClass, 0)
        for c in self.categories:
            out[c.fault_class] += c.count
        return out

    def rate_per_s(self, gpus: int, classes: Iterable[FaultClass] | None = None) -> float:
        """Fleet-wide interruption rate (of `classes` only, if given), scaled linearly with the
        number of GPUs."""
        wanted = set(FaultClass if classes is None else classes)
        count = sum(c.count for c in self.categories if c.fault_class in wanted)
        return count / (self.days * 86400.0) * (gpus / self.gpus)


_N, _R, _H, _S, _L = (
    FaultClass.NODE,
    FaultClass.RESTART,
    FaultClass.HANG,
    FaultClass.SDC,
    FaultClass.LINK,
)

# "The Llama 3 Herd of Models" (Meta, 2024), Table 5: root causes of the 419 unexpected
# interruptions in a 54-day snapshot of Llama 3 405B pre-training on 16,384 H100 GPUs.
LLAMA3_CATEGORIES: tuple[tuple[str, int, FaultClass], ...] = (
    ("Faulty GPU", 148, _N),
    ("GPU HBM3 Memory", 72, _N),
    ("Software Bug", 54, _R),
    ("Network Switch/Cable", 35, _L),
    ("Host Maintenance", 32, _N),
    ("GPU SRAM Memory", 19, _N),
    ("GPU System Processor", 17, _N),
    ("NIC", 7, _N),
    ("NCCL Watchdog Timeouts", 7, _H),
    ("Silent Data Corruption", 6, _S),
    ("GPU Thermal Interface + Sensor", 6, _N),
    ("SSD", 3, _N),
    ("Power Supply", 3, _N),
    ("Server Chassis", 2, _N),
    ("IO Expansion Board", 2, _N),
    ("Dependency", 2, _R),
    ("CPU", 2, _N),
    ("System Memory", 2, _N),
)

LLAMA3 = Trace(
    name="llama3-405b (Llama 3 paper, Table 5)",
    gpus=16384,
    days=54,
    categories=tuple(Category(name=n, count=c, fault_class=k) for n, c, k in LLAMA3_CATEGORIES),
)


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse_trace(data: object, source: str) -> Trace:
    try:
        trace = Trace.model_validate(data)
    except ValidationError as e:
        lines = [f"  {_field_path(err['loc'])}: {err['msg']}" for err in e.errors()]
        raise InputError(f"{source}: invalid trace\n" + "\n".join(lines)) from None
    if trace.total == 0:
        raise InputError(f"{source}: invalid trace\n  categories: every count is 0")
    return trace


def load_trace(path: Path) -> Trace:
    if path.suffix == ".json":
        return parse_trace(read_json(path, "a failure trace"), str(path))
    return parse_trace(parse_yaml(read_text(path, "a failure trace"), str(path)), str(path))
