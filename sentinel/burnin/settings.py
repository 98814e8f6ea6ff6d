"""Burn-in settings: one frozen object, validated at the CLI edge and shipped to every rank."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace

from sentinel.exitcodes import InputError

PHASES = ("drift", "collectives", "links", "stragglers", "sdc")
LINK_SEARCHES = ("auto", "circle", "bisection", "both")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """`4K`, `16M`, `1G` or plain bytes, like nccl-tests' -b/-e."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text.upper())
    if not m or int(m.group(1)) <= 0:
        raise InputError(f"bad size {text!r}: use bytes or a K/M/G suffix, e.g. 64K or 16M")
    return int(m.group(1)) * _UNITS[m.group(2)]


def parse_phases(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in names if p not in PHASES]
    if not names or unknown:
        raise InputError(f"--phases: unknown phase(s) {unknown or text!r}; choose from {PHASES}")
    return tuple(p for p in PHASES if p in names)


@dataclass(frozen=True)
class Thresholds:
    """Judgement knobs. Fractions are relative to the fleet's median (or to the baseline)."""

    link_tolerance: float = 0.40  # a node whose links run 40% under the others': flagged
    link_mad_k: float = 3.0  # ... and more than k robust deviations under it
    straggler_slowdown: float = 0.04  # a rank 4% slower than the others' median: flagged
    straggler_mad_k: float = 3.0
    baseline_tolerance: float = 0.20  # variance = (value - baseline) / baseline below -20%: fail


@dataclass(frozen=True)
class BurninSettings:
    phases: tuple[str, ...] = PHASES
    quick: bool = False
    min_bytes: int = 1 << 12
    max_bytes: int = 1 << 24
    step_factor: int = 4
    warmup: int = 2
    iters: int = 5
    link_bytes: int = 1 << 22
    link_trials: int = 30
    link_search: str = "auto"
    gemm_size: int = 384  # CPU ranks (simulated fleets)
    gemm_size_gpu: int = 8192
    gemm_rounds: int = 192  # a 1.05x CPU rank's score has ~0.5% noise on a loaded 2-core VM
    gemm_reps: int = 3
    membw_bytes: int = 1 << 24
    sdc_size: int = 128
    sdc_chain: int = 8  # twice: a rank corrupting half its products escapes once in 2**16
    seed: int = 1234
    backend: str = "auto"
    scenario: str | None = None  # simulated fleets only: faults to inject before measuring
    allow_drift: tuple[str, ...] = ()  # fingerprint fields allowed to differ between nodes
    result_path: str | None = None  # rank 0 writes the report here
    baseline_path: str | None = None  # judge against a saved healthy fleet
    progress: bool = True
    thresholds: Thresholds = field(default_factory=Thresholds)

    def sizes(self) -> list[int]:
        out, b = [], self.min_bytes
        while b <= self.max_bytes:
            out.append(b)
            b *= self.step_factor
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BurninSettings:
        doc = json.loads(text)
        doc["phases"] = tuple(doc["phases"])
        doc["allow_drift"] = tuple(doc["allow_drift"])
        doc["thresholds"] = Thresholds(**doc["thresholds"])
        return cls(**doc)

    def validated(self) -> BurninSettings:
        if self.min_bytes > self.max_bytes:
            raise InputError(f"--min-bytes {self.min_bytes} exceeds --max-bytes {self.max_bytes}")
        if self.step_factor < 2:
            raise InputError("--step-factor must be 2 or more")
        if self.iters < 1 or self.warmup < 0:
            raise InputError("--iters must be >= 1 and --warmup >= 0")
        if self.link_search not in LINK_SEARCHES:
            raise InputError(f"--link-search must be one of {LINK_SEARCHES}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise InputError("--backend must be auto, gloo or nccl")
        return self


def quick_settings(base: BurninSettings) -> BurninSettings:
    """About a minute for 8 simulated ranks on two cores."""
    return replace(
        base,
        quick=True,
        min_bytes=1 << 12,
        max_bytes=1 << 20,
        step_factor=4,
        warmup=1,
        iters=3,
        link_bytes=1 << 20,
        link_trials=20,
        gemm_size=384,
        gemm_rounds=40,
        gemm_reps=2,
        membw_bytes=1 << 22,
    )
