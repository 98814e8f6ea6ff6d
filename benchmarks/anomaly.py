"""Spike-detector figures: false positives on clean curves, detection of injected spikes.

Runs every policy in `trainer_hooks.anomaly` (robust = the default; megatron = 10x running max;
olmo = mean + 6 sigma over 128; zclip = EMA z-score 2.5) on the same synthetic loss and
grad-norm curves (tests/hooks_support/curves.py): per-step false-positive rate and share of clean
runs with any false positive; detection rate of spikes x1.5 .. x10. Last line of output: JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hooks_support.curves import evaluate
from trainer_hooks.anomaly import POLICIES


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args()
    results = {name: evaluate(name, args.runs, args.steps, args.seed) for name in POLICIES}
    for name, r in results.items():
        det = r["detection"]
        print(
            f"{name:9s} fp/step={r['false_positive_rate']:.2e} "
            f"runs_with_fp={r['runs_with_false_positive']:.2f} "
            f"loss={det['loss']} grad_norm={det['grad_norm']}"
        )
    robust = results["robust"]
    print(
        json.dumps(
            {
                "anomaly_false_positive_rate": robust["false_positive_rate"],
                "anomaly_runs_with_false_positive": robust["runs_with_false_positive"],
                "anomaly_loss_detection_x2": robust["detection"]["loss"]["2.0"],
                "anomaly_grad_detection_x5": robust["detection"]["grad_norm"]["5.0"],
                "policies": results,
                "runs": args.runs,
                "steps": args.steps,
            }
        )
    )


if __name__ == "__main__":
    main()
