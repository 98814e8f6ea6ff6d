"""The projection's inputs, its assumptions and its sensitivity table, as JSON and as text."""

from __future__ import annotations

from typing import Any

from sentinel.lab.goodput.measurements import Measurements
from sentinel.lab.goodput.origin import Input
from sentinel.lab.goodput.sensitivity import Row


def _input_dict(r: Input) -> dict[str, Any]:
    return {
        "key": r.key,
        "label": r.label,
        "value": r.value,
        "unit": r.unit,
        "origin": r.origin,
        "source": r.source,
    }


def measurements_dict(m: Measurements, where: str) -> dict[str, Any]:
    return {
        "file": where,
        "date": m.date,
        "command": m.command,
        "machine": m.machine,
        "drills": [d.model_dump(mode="json") for d in m.drills],
        "classes": {str(k): v.model_dump(mode="json") for k, v in m.classes.items()},
    }


def inputs_json(rows: list[Input], measurements: dict[str, Any], sens: list[Row]) -> dict[str, Any]:
    return {
        "measurements": measurements,
        "inputs": [_input_dict(r) for r in rows],
        "assumptions": [_input_dict(r) for r in rows if r.origin == "assumption"],
        "sensitivity": [
            {
                **_input_dict(s.input),
                "points": [
                    {
                        "factor": p.factor,
                        "sentinel_ratio": p.sentinel_ratio,
                        "baseline_ratio": p.baseline_ratio,
                        "delta": p.delta,
                    }
                    for p in s.points
                ],
            }
            for s in sens
        ],
    }


def _value(r: dict[str, Any]) -> str:
    v = r["value"]
    text = f"{v:.3g}" if v < 1000 or v >= 1e6 else f"{v:,.0f}"
    return f"{text} {r['unit']}".strip()


def render_inputs(rep: dict[str, Any]) -> str:
    m = rep["measurements"]
    lines = [
        f"Sentinel's times: measured by drills, {m['file']} ({m['date']})",
        f"  made by: {m['command']}",
        f"  on: {m['machine']}",
        "",
        "inputs (value, origin: source)",
    ]
    for r in rep["inputs"]:
        lines.append(f"  {r['label']:<38}{_value(r):>12}  {r['origin']}: {r['source']}")
    n = len(rep["assumptions"])
    lines += [f"  {n} of {len(rep['inputs'])} inputs are assumptions: not measurable here", ""]
    lines.append(
        f"{'sensitivity (one input x0.5 / x2)':<40}{'value':>12}"
        f"{'sentinel x0.5':>15}{'x2':>9}{'delta x0.5':>13}{'x2':>9}"
    )
    for s in rep["sensitivity"]:
        lo, hi = s["points"]
        lines.append(
            f"  {s['label']:<38}{_value(s):>12}{100 * lo['sentinel_ratio']:>14.2f}%"
            f"{100 * hi['sentinel_ratio']:>8.2f}%{100 * lo['delta']:>+12.2f}p"
            f"{100 * hi['delta']:>+8.2f}p"
        )
    return "\n".join(lines)
