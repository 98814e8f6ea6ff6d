"""The goodput projection as a JSON-ready dict and as a table for a person."""

from __future__ import annotations

import dataclasses
from typing import Any

from sentinel.lab.goodput.decompose import Step, decomposition_dict, render_decomposition
from sentinel.lab.goodput.levers import LeverRow
from sentinel.lab.goodput.model import RepairPath
from sentinel.lab.goodput.simulate import CATEGORIES, Fleet, Summary


def summary_dict(s: Summary) -> dict[str, Any]:
    m = s.model
    return {
        "ratio_mean": s.mean,
        "ratio_stdev": s.stdev,
        "ratio_min": min(s.ratios),
        "ratio_max": max(s.ratios),
        "hours": {k: v / 3600.0 for k, v in s.mean_seconds().items()},
        "spares": m.spares,
        "checkpoint_interval_s": s.interval_s,
        "checkpoint_interval_rule": "fixed" if m.checkpoint_interval_s else "young-daly",
        "checkpoint_cost_s": m.checkpoint_cost_s,
        "checkpoint_commit_lag_s": m.checkpoint_commit_lag_s,
        "detect_s": {str(k): v for k, v in m.detect_s.items()},
        "paths": {str(k): str(m.path_of(k)) for k in m.detect_s},
        # A class the live path repairs has no full stop to resume from.
        "resume_s": {str(k): v for k, v in m.resume_s.items() if m.path_of(k) != RepairPath.LIVE},
        "live": dataclasses.asdict(m.live) if m.live is not None else None,
        "node_repair_h": m.node_repair_s / 3600.0,
        "manual_replace_min": m.manual_replace_s / 60.0,
        "sources": dict(m.sources),
    }


def build_report(
    fleet: Fleet,
    sentinel: Summary,
    baseline: Summary,
    decomposition: list[Step],
    levers: list[LeverRow],
    target: float,
    seed: int,
    checkpoint: dict[str, Any],
) -> dict[str, Any]:
    t = fleet.trace
    return {
        "trace": {
            "name": t.name,
            "gpus": t.gpus,
            "days": t.days,
            "interruptions": t.total,
            "categories": [c.model_dump(mode="json") for c in t.categories],
        },
        "fleet": {
            "gpus": fleet.gpus,
            "days": fleet.days,
            "mtbf_h": fleet.mtbf_s / 3600.0,
            "expected_interruptions": fleet.expected_interruptions,
            "simulated_interruptions_mean": sentinel.mean_interruptions(),
            "simulated_by_class_mean": fleet.mean_by_class(),
            "runs": len(sentinel.runs),
            "seed": seed,
        },
        "checkpoint": checkpoint,
        "sentinel": summary_dict(sentinel),
        "baseline": summary_dict(baseline),
        "delta": sentinel.mean - baseline.mean,
        "decomposition": decomposition_dict(decomposition),
        "levers": [
            {
                "lever": r.lever,
                "setting": r.setting,
                "ratio_mean": r.summary.mean,
                "ratio_stdev": r.summary.stdev,
                "delta": r.delta,
            }
            for r in levers
        ],
        "target": target,
        "meets_target": sentinel.mean >= target,
        "reaches_target": [f"{r.lever}: {r.setting}" for r in levers if r.summary.mean >= target],
    }


def _pct(x: float) -> str:
    return f"{100 * x:6.2f}%"


def _checkpoint_line(c: dict[str, Any]) -> str:
    state = (
        f"checkpoint: {c['params'] / 1e9:g}B params x {c['bytes_per_param']:g} B = "
        f"{c['state_tb']:.2f} TB, {c['gb_per_gpu']:.2f} GB per GPU; "
    )
    if c["source"] != "derived":
        return state + f"a save blocks {c['blocking_s_used']:.2f} s ({c['source']})"
    if not c["asynchronous"]:
        return state + (
            f"a sync save blocks {c['blocking_s']:.2f} s (coordination {c['coordination_s']:g} s"
            f" + write at {c['storage_tb_per_s']:g} TB/s)"
        )
    return state + (
        f"an async save blocks {c['blocking_s']:.2f} s (staging {c['staging_s']:.3f} s at "
        f"{c['staging_gb_per_s']:g} GB/s + coordination {c['coordination_s']:g} s), committed "
        f"{c['write_s']:.1f} s later ({c['storage_tb_per_s']:g} TB/s storage)"
    )


def render_text(rep: dict[str, Any]) -> str:
    fl, sen, base = rep["fleet"], rep["sentinel"], rep["baseline"]
    lines = [
        f"trace: {rep['trace']['name']}: {rep['trace']['interruptions']} interruptions in "
        f"{rep['trace']['days']:g} days on {rep['trace']['gpus']} GPUs",
        f"fleet: {fl['gpus']} GPUs for {fl['days']:g} days, MTBF {fl['mtbf_h']:.2f} h, "
        f"{fl['expected_interruptions']:.0f} interruptions expected, "
        f"{fl['simulated_interruptions_mean']:.1f} simulated (mean of {fl['runs']} runs, "
        f"seed {fl['seed']})",
        "  by class: "
        + ", ".join(f"{k} {v:.1f}" for k, v in fl["simulated_by_class_mean"].items()),
        "",
        _checkpoint_line(rep["checkpoint"]),
        "",
        f"{'time by category (h, mean)':<28}{'baseline':>12}{'sentinel':>12}",
    ]
    for k in CATEGORIES:
        lines.append(f"  {k:<26}{base['hours'][k]:>12.1f}{sen['hours'][k]:>12.1f}")
    lines += [
        f"  {'checkpoint interval (s)':<26}{base['checkpoint_interval_s']:>12.0f}"
        f"{sen['checkpoint_interval_s']:>12.0f}",
        f"  {'hot spares':<26}{base['spares']:>12}{sen['spares']:>12}",
        "",
        "effective training time ratio (useful / wall), mean ± stdev [min, max]:",
        f"  baseline (no Sentinel)  {_pct(base['ratio_mean'])} ± {100 * base['ratio_stdev']:.2f} "
        f"[{_pct(base['ratio_min']).strip()}, {_pct(base['ratio_max']).strip()}]",
        f"  sentinel                {_pct(sen['ratio_mean'])} ± {100 * sen['ratio_stdev']:.2f} "
        f"[{_pct(sen['ratio_min']).strip()}, {_pct(sen['ratio_max']).strip()}]",
        f"  delta                   {100 * rep['delta']:+.2f} points",
        "",
        *render_decomposition(rep["decomposition"]),
        "",
        f"{'lever (sentinel, one knob turned)':<42}{'ratio':>9}{'change':>10}",
    ]
    for r in rep["levers"]:
        label = f"{r['lever']}: {r['setting']}"
        lines.append(f"  {label:<40}{_pct(r['ratio_mean']):>9}{100 * r['delta']:>+9.2f}p")
    verdict = "meets" if rep["meets_target"] else "misses"
    lines += ["", f"target {_pct(rep['target']).strip()}: sentinel {verdict} it"]
    if not rep["meets_target"]:
        reach = ", ".join(rep["reaches_target"]) or "no single lever above"
        lines.append(f"  reached by: {reach}")
    return "\n".join(lines)
