"""The repair paths side by side at several fleet sizes, each on the same failures: today's
restart, the warm restart everywhere, and the live configuration (each fault the path the
catalog gives it), with the no-Sentinel baseline, every repair's parts at each size, and
whether the live configuration meets the goal at the largest size (and what it loses most to).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sentinel.lab.goodput.inputs import Plan, build_models, sentinel_detect_s
from sentinel.lab.goodput.model import RepairPath
from sentinel.lab.goodput.paths import Recovery, paths_for
from sentinel.lab.goodput.repairs import Layout, Parts, full_stop_parts, live_parts
from sentinel.lab.goodput.scaling import SPARE_RULE, spares_for, throughput
from sentinel.lab.goodput.simulate import CATEGORIES, Fleet, Summary
from sentinel.lab.goodput.trace import NEEDS_NODE, FaultClass, Trace

CONFIGURATIONS = {
    Recovery.RESTART: "restart (today's path)",
    Recovery.WARM_RESTART: "warm restart",
    Recovery.CATALOG: "live (the catalog's paths)",
}


def rule_spares(trace: Trace, gpus: int, values: Mapping[str, float]) -> int:
    return spares_for(trace.rate_per_s(gpus, NEEDS_NODE), values["node_repair_h"] * 3600.0)


@dataclass(frozen=True)
class Point:
    """One fleet size: its spares, the baseline, and each configuration's projection."""

    layout: Layout
    spares: int
    baseline: Summary
    paths: dict[Recovery, Summary]


def compare(
    trace: Trace,
    values: Mapping[str, float],
    plan: Plan,
    sizes: tuple[int, ...],
    days: float,
    seeds: list[int],
    fixed_spares: int | None,
) -> list[Point]:
    """Each size's projection under each configuration; `plan` gives what is held (the
    checkpoint rule, the batch on the live path); spares by the rule unless fixed."""
    points = []
    for gpus in sizes:
        fleet = Fleet(trace, gpus=gpus, days=days, seeds=seeds)
        spares = rule_spares(trace, gpus, values) if fixed_spares is None else fixed_spares
        summaries, baseline = {}, None
        for recovery in CONFIGURATIONS:
            at = Plan(gpus, spares, plan.interval_s, plan.asynchronous, recovery, plan.keep_batch)
            sentinel, base, _spec = build_models(values, at)
            summaries[recovery] = fleet.evaluate(sentinel)
            baseline = baseline or fleet.evaluate(base)
        assert baseline is not None
        points.append(Point(Layout.of(values, gpus), spares, baseline, summaries))
    return points


def _parts(parts: Parts) -> dict[str, Any]:
    return {"parts_s": parts, "total_s": sum(parts.values())}


def repairs_dict(values: Mapping[str, float], lay: Layout, keep_batch: bool) -> dict[str, Any]:
    """Every class's repair under each configuration at one size, part by part."""
    out: dict[str, Any] = {}
    for recovery in CONFIGURATIONS:
        paths = paths_for(recovery)
        replicated = recovery == Recovery.CATALOG
        out[recovery.value] = {
            str(c): {"path": str(p)} | _parts(full_stop_parts(values, c, p, lay, replicated))
            for c, p in paths.items()
            if p != RepairPath.LIVE
        }
    live = live_parts(values, lay)
    microbatches = max(1, round(values["layout.microbatches"]))
    regroup = sum(live.regroup.values())
    on_live = [c for c, p in paths_for(Recovery.CATALOG).items() if p == RepairPath.LIVE]
    out["live_path"] = {
        "stall_by_class_s": {
            str(c): max(values["live.stall_s"], sentinel_detect_s(values, c)) + regroup
            for c in on_live
        },
        "stall": _parts(live.stall),
        "join": _parts(live.join),
        "regroup_at_join": _parts(live.regroup),
        "throughput_one_replica_out": throughput(lay.replicas, 1, microbatches, keep_batch),
    }
    return out


def _summary(s: Summary) -> dict[str, Any]:
    return {
        "ratio_mean": s.mean,
        "ratio_stdev": s.stdev,
        "hours": {k: v / 3600.0 for k, v in s.mean_seconds().items()},
        "checkpoint_interval_s": s.interval_s,
    }


def _largest_part(
    repairs: dict[str, dict[str, Any]], counts: Mapping[FaultClass, int]
) -> tuple[str, float]:
    """The part of the full-stop repairs that takes the most time, weighing each class by its
    count in the trace, and its share of that time."""
    total: dict[str, float] = {}
    for cls, rep in repairs.items():
        for name, seconds in rep["parts_s"].items():
            total[name] = total.get(name, 0.0) + counts[FaultClass(cls)] * seconds
    whole = sum(total.values())
    if not whole:
        return "none", 0.0
    name = max(total, key=total.__getitem__)
    return name, total[name] / whole


def compare_dict(
    points: list[Point],
    values: Mapping[str, float],
    keep_batch: bool,
    goal: float,
    trace_counts: Mapping[FaultClass, int],
) -> dict[str, Any]:
    scales: list[dict[str, Any]] = [
        {
            "gpus": p.layout.gpus,
            "nodes": p.layout.nodes,
            "replicas": p.layout.replicas,
            "replica_gpus": p.layout.replica_gpus,
            "spares": p.spares,
            "baseline": _summary(p.baseline),
            **{r.value: _summary(s) for r, s in p.paths.items()},
            "repairs": repairs_dict(values, p.layout, keep_batch),
        }
        for p in points
    ]
    last = points[-1]
    live = last.paths[Recovery.CATALOG]
    repairs = scales[-1]["repairs"]["catalog"]
    hours = live.mean_seconds()
    losses = sorted(
        ((k, hours[k] / 3600.0) for k in CATEGORIES if k != "useful"), key=lambda kv: -kv[1]
    )
    return {
        "configurations": {r.value: label for r, label in CONFIGURATIONS.items()},
        "paths": {str(c): str(p) for c, p in paths_for(Recovery.CATALOG).items()},
        "spare_rule": SPARE_RULE,
        "scales": scales,
        "goal": {
            "gpus": last.layout.gpus,
            "target": goal,
            "live_ratio": live.mean,
            "met": live.mean >= goal,
            "largest_losses_h": dict(losses[:3]),
            "largest_repair_part": _largest_part(repairs, trace_counts),
        },
    }


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _row(label: str, cells: list[str]) -> str:
    return f"  {label:<48}" + "".join(f"{c:>15}" for c in cells)


def _parts_rows(title: str, per_scale: list[dict[str, Any]]) -> list[str]:
    lines = [f"  {title}"]
    lines += [
        _row(f"  {name}", [f"{p['parts_s'][name]:.1f} s" for p in per_scale])
        for name in per_scale[0]["parts_s"]
    ]
    return [*lines, _row("  total", [f"{p['total_s']:.1f} s" for p in per_scale])]


def render_compare(rep: dict[str, Any]) -> str:
    scales = rep["scales"]
    sizes = [f"{s['gpus']:,} GPUs" for s in scales]
    lines = [_row("repair, the drills' stages carried to each size", sizes)[2:]]
    lines.append(_row("nodes", [f"{s['nodes']:,}" for s in scales]))
    width = scales[0]["replica_gpus"]
    lines.append(
        _row(f"live path: replicas of {width} GPUs", [f"{s['replicas']:,}" for s in scales])
    )
    reps = [s["repairs"] for s in scales]
    lines += _parts_rows(
        "restart (today's path), a node fault", [r["restart"]["node"] for r in reps]
    )
    crash = [r["catalog"]["restart"] for r in reps]
    lines += _parts_rows("warm restart in the live configuration, a crash", crash)
    live = [r["live_path"] for r in reps]
    for key, label in (
        ("stall", "survivors' stall"),
        ("join", "spare join"),
        ("regroup_at_join", "survivors' stall at the join"),
    ):
        lines += _parts_rows(f"live path, a node fault: {label}", [x[key] for x in live])
    lines.append(
        _row(
            "live path: throughput, one replica out",
            [_pct(x["throughput_one_replica_out"]) for x in live],
        )
    )
    for cls in live[0]["stall_by_class_s"]:
        lines.append(
            _row(
                f"live path: survivors' stall, {cls} (>= detection)",
                [f"{x['stall_by_class_s'][cls]:.1f} s" for x in live],
            )
        )
    lines += ["", _row("effective training time (useful / wall)", sizes)[2:]]
    lines.append(
        _row("baseline (no Sentinel)", [_pct(s["baseline"]["ratio_mean"]) for s in scales])
    )
    for key, label in rep["configurations"].items():
        lines.append(_row(label, [_pct(s[key]["ratio_mean"]) for s in scales]))
    lines.append(_row("hot spares", [str(s["spares"]) for s in scales]))
    lines.append(f"  spares by rule: {rep['spare_rule']} (unless --spares)")
    paths = ", ".join(f"{c} {p}" for c, p in rep["paths"].items())
    lines.append(f"  live configuration's paths (mirroring the fault catalog): {paths}")
    g = rep["goal"]
    verdict = "met" if g["met"] else "missed"
    losses = ", ".join(f"{k} {h:.1f} h" for k, h in g["largest_losses_h"].items())
    part, share = g["largest_repair_part"]
    lines += [
        "",
        f"goal {_pct(g['target'])} at {g['gpus']:,} GPUs with the live path: {verdict} "
        f"({_pct(g['live_ratio'])})",
        f"  its largest losses: {losses}; of its full-stop repairs' time, {_pct(share)} is {part}",
    ]
    return "\n".join(lines)
