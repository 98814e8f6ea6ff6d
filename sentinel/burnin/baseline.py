"""The validation baseline and its judgement: what a node must measure before it returns.

A healthy node's figures, written by `sentinel burnin --validate --save-baseline FILE` (into the
fleet burn-in's baseline file when it is one: its `validation` section), read by the coordinator
(`coordinator.validation.baseline`) and sent with every `node.validate` command, so the node
under test needs no file of its own. Torch-free: the coordinator imports it.

The judgement compares a node's measurement with the baseline: its GEMM may be at most
`gemm_tolerance` slower than the baseline's median (the burn-in's own `baseline_tolerance`,
20%: a figure measured at another time on another node is noisier than the straggler screen's
same-round comparison, 4%); on a CPU device, whose time moves with the host's load, the GEMM's
ratio to the host's in the same rounds is compared instead. Its loopback bandwidth may be at
most `loopback_tolerance` lower (on a CPU device: its ratio to the host's all-reduce in the same
rounds, against the baseline's ratio), and its SDC recompute must give the same digest twice and, on
the baseline's device model, the baseline's digest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sentinel.exitcodes import InputError
from sentinel.inputs import read_json
from sentinel.protocol import ValidationCheck, format_validation_error

SECTION = "validation"  # the key of a baseline file that holds these figures


class ValidationBaseline(BaseModel):
    """A healthy node's validation figures (the `validation` section of a baseline file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_s: float = Field(gt=0)  # median seconds of one GEMM of gemm_size, per GPU
    gemm_size: int = Field(ge=16, le=65536)
    # A CPU device's GEMM time over the host's in the same rounds (absent for a GPU).
    gemm_vs_host: float | None = Field(default=None, gt=0)
    loopback_gbps: float = Field(gt=0)  # 2-process gloo all_reduce over 127.0.0.1
    # A CPU device's loopback bandwidth over the host's in the same rounds (absent for a GPU).
    loopback_vs_host: float | None = Field(default=None, gt=0)
    loopback_bytes: int = Field(ge=1024, le=1 << 30)
    sdc_digest: str = Field(min_length=1, max_length=64)  # the recompute's digest ...
    device: str = Field(min_length=1, max_length=200)  # ... on this device model
    gemm_tolerance: float = Field(default=0.20, gt=0, lt=10)
    loopback_tolerance: float = Field(default=0.50, gt=0, lt=1)


def load_validation_baseline(path: Path) -> ValidationBaseline:
    """Read the `validation` section of a baseline file; InputError says what is wrong and how
    to make one."""
    doc = read_json(path, "a validation baseline")
    section = doc.get(SECTION) if isinstance(doc, dict) else None
    if not isinstance(section, dict):
        raise InputError(
            f"validation baseline {path}: no {SECTION!r} section; record one on a healthy node"
            f" with `sentinel burnin --validate --save-baseline {path}`"
        )
    try:
        return ValidationBaseline.model_validate(section)
    except ValidationError as e:
        raise InputError(f"validation baseline {path}: {format_validation_error(e)}") from None


def save_validation_baseline(path: Path, baseline: ValidationBaseline) -> None:
    """Write the section, keeping what else the file holds (a fleet burn-in's figures)."""
    doc: dict[str, Any] = {}
    if path.exists():
        old = read_json(path, "--save-baseline: an existing baseline file is added to")
        doc = old if isinstance(old, dict) else {}
    doc[SECTION] = baseline.model_dump(mode="json")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class Measured:
    """What a validation run measured on the node, one entry per GPU where it is per GPU."""

    device: str
    gemm_s: list[float] = field(default_factory=list)
    digests: list[tuple[str, str]] = field(default_factory=list)  # (first, repeat) per GPU
    loopback_gbps: float | None = None
    errors: list[str] = field(default_factory=list)  # a GPU whose arithmetic raised
    gemm_vs_host: list[float] = field(default_factory=list)  # per GPU, CPU devices only
    loopback_vs_host: float | None = None  # CPU devices only


def judge(m: Measured, b: ValidationBaseline) -> list[ValidationCheck]:
    """The three checks, each with its figure, the baseline's and the limit."""
    return [_gemm(m, b), _sdc(m, b), _loopback(m, b)]


def _gemm(m: Measured, b: ValidationBaseline) -> ValidationCheck:
    # A CPU device measured against the host is judged by that ratio when the baseline has one.
    paired = b.gemm_vs_host is not None and len(m.gemm_vs_host) == len(m.gemm_s)
    base = b.gemm_vs_host if paired and b.gemm_vs_host else b.gemm_s
    limit = base * (1 + b.gemm_tolerance)
    if m.errors or not m.gemm_s:
        why = "; ".join(m.errors) or "no GEMM was timed"
        return ValidationCheck(name="gemm", passed=False, baseline=base, limit=limit, detail=why)
    values = m.gemm_vs_host if paired else m.gemm_s
    worst = max(range(len(values)), key=lambda i: values[i])
    value = values[worst]
    what = f"GPU {worst}: {b.gemm_size}^3 GEMM"
    if paired:
        detail = (
            f"{what} in {value:.3f}x the host's time in the same rounds vs the baseline's"
            f" {base:.3f}x (limit {limit:.3f}x, +{b.gemm_tolerance:.0%})"
        )
    else:
        detail = (
            f"{what} in {value * 1e3:.2f} ms vs the baseline's median {base * 1e3:.2f} ms"
            f" (limit {limit * 1e3:.2f} ms, +{b.gemm_tolerance:.0%})"
        )
    return ValidationCheck(
        name="gemm", passed=value <= limit, value=value, baseline=base, limit=limit, detail=detail
    )


def _sdc(m: Measured, b: ValidationBaseline) -> ValidationCheck:
    bad = []
    for gpu, (first, second) in enumerate(m.digests):
        if first != second:
            bad.append(f"GPU {gpu}: recompute differs from itself ({first} vs {second})")
        elif m.device == b.device and first != b.sdc_digest:
            bad.append(f"GPU {gpu}: digest {first} differs from the baseline's {b.sdc_digest}")
    if not m.digests:
        bad.append("; ".join(m.errors) or "no recompute ran")
    detail = "; ".join(bad) or f"{len(m.digests)} GPU(s) agree with themselves and the baseline"
    return ValidationCheck(name="sdc", passed=not bad, detail=detail)


def _loopback(m: Measured, b: ValidationBaseline) -> ValidationCheck:
    # A CPU device measured against the host is judged by that ratio when the baseline has one.
    paired = b.loopback_vs_host is not None and m.loopback_vs_host is not None
    base = b.loopback_vs_host if paired and b.loopback_vs_host else b.loopback_gbps
    limit = base * (1 - b.loopback_tolerance)
    value = m.loopback_vs_host if paired else m.loopback_gbps
    if value is None:
        return ValidationCheck(
            name="loopback",
            passed=False,
            baseline=base,
            limit=limit,
            detail="the loopback test did not run",
        )
    if paired:
        detail = (
            f"{m.loopback_gbps:.3f} GB/s, {value:.3f}x the host's all-reduce in the same rounds"
            f" vs the baseline's {base:.3f}x (limit {limit:.3f}x, -{b.loopback_tolerance:.0%})"
        )
    else:
        detail = (
            f"{value:.3f} GB/s vs the baseline's {base:.3f} GB/s"
            f" (limit {limit:.3f} GB/s, -{b.loopback_tolerance:.0%})"
        )
    return ValidationCheck(
        name="loopback",
        passed=value >= limit,
        value=value,
        baseline=base,
        limit=limit,
        detail=detail,
    )


def reason(checks: list[ValidationCheck]) -> str:
    """Why the node failed, one failed check after another ("" when it passed)."""
    return "; ".join(f"{c.name}: {c.detail}" for c in checks if not c.passed)
