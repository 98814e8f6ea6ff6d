"""Synthetic training curves for measuring spike detectors: clean runs and runs with spikes.

Loss: a power-law decay with multiplicative log-normal noise (sigma 3%), a slowly drifting
batch-difficulty term and occasional naturally hard batches (+5..15%). Grad norm: decaying with
heavy log-normal noise (sigma 15%) and occasional natural bumps (up to +50%). Nothing in a clean
run should be reported; spikes of x1.5 .. x10 are injected into copies of the curves, several
per run at separated steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer_hooks.anomaly import AnomalyMonitor

FACTORS = (1.5, 2.0, 3.0, 5.0, 10.0)


def clean_curves(rng: np.random.Generator, steps: int) -> dict[str, np.ndarray]:
    t = np.arange(steps)
    drift = np.cumsum(rng.normal(0, 0.002, steps))
    drift -= np.linspace(0, drift[-1], steps)  # a bounded random walk
    hard = np.where(rng.random(steps) < 0.01, rng.uniform(1.05, 1.15, steps), 1.0)
    loss = (2.0 + 3.0 * (1 + t / 50) ** -0.5) * np.exp(rng.normal(0, 0.03, steps) + drift) * hard
    bumps = np.where(rng.random(steps) < 0.005, rng.uniform(1.1, 1.5, steps), 1.0)
    grad = (0.4 + 2.0 * np.exp(-t / 100)) * np.exp(rng.normal(0, 0.15, steps)) * bumps
    return {"loss": loss, "grad_norm": grad}


def run_detector(policy: str, curves: dict[str, np.ndarray]) -> dict[str, set[int]]:
    mon = AnomalyMonitor(policy)
    flagged: dict[str, set[int]] = {"loss": set(), "grad_norm": set()}
    for metric, values in curves.items():
        for step, v in enumerate(values.tolist()):
            if mon.update(step, metric, v) is not None:
                flagged[metric].add(step)
    return flagged


def evaluate(policy: str, runs: int = 40, steps: int = 1000, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    false_flags = 0
    runs_with_fp = 0
    hits = {m: {f: 0 for f in FACTORS} for m in ("loss", "grad_norm")}
    for _ in range(runs):
        curves = clean_curves(rng, steps)
        flagged = run_detector(policy, curves)
        n = sum(len(s) for s in flagged.values())
        false_flags += n
        runs_with_fp += n > 0
        spiked = {m: v.copy() for m, v in curves.items()}
        at: dict[int, float] = {}
        for i, factor in enumerate(rng.permutation(FACTORS)):
            step = 200 + i * (steps - 250) // len(FACTORS) + int(rng.integers(0, 20))
            at[step] = float(factor)
            for v in spiked.values():
                v[step] *= factor
        flagged = run_detector(policy, spiked)
        for metric, steps_flagged in flagged.items():
            for step, factor in at.items():
                hits[metric][factor] += step in steps_flagged
    checked = runs * steps * 2
    return {
        "policy": policy,
        "false_positive_rate": false_flags / checked,
        "runs_with_false_positive": runs_with_fp / runs,
        "detection": {m: {str(f): h / runs for f, h in d.items()} for m, d in hits.items()},
    }
