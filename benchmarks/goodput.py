"""Goodput simulator benchmark: the Llama 3 reference trace, Sentinel vs no Sentinel.

    python benchmarks/goodput.py [--runs N] [--measurements FILE]

The inputs are `sentinel goodput`'s with no flags: Sentinel's times from the drill measurements
(default: the copy shipped in `sentinel/data/goodput_measurements.json`, made by
`benchmarks/goodput_measurements.py`), the rest its named assumptions.

Prints a JSON object as the last line: `sentinel_ratio`, `baseline_ratio` and `delta` (mean
effective training time ratio over `--runs` seeds, same failures for both), `interruptions_mean`
(vs the trace's 419), `young_daly_interval_s`, `checkpoint_cost_s` and `checkpoint_commit_lag_s`
(derived by `sentinel/goodput/checkpoint.py`), and `run_ms` (one simulated 54-day run of
16,384 GPUs, wall clock, mean).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sentinel.goodput.inputs import Plan, build_models, default_rows  # noqa: E402
from sentinel.goodput.measurements import read_measurements  # noqa: E402
from sentinel.goodput.simulate import Fleet  # noqa: E402
from sentinel.goodput.trace import LLAMA3  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--measurements", type=Path, help="default: the shipped measurements")
    args = ap.parse_args()
    meas, where = read_measurements(args.measurements)
    rows = default_rows(meas, where)
    plan = Plan(gpus=LLAMA3.gpus, spares=8, interval_s=None, asynchronous=True)
    sentinel, baseline, _spec = build_models({r.key: r.value for r in rows}, plan)
    fleet = Fleet(LLAMA3, gpus=LLAMA3.gpus, days=LLAMA3.days, seeds=list(range(args.runs)))
    start = time.perf_counter()
    sen = fleet.evaluate(sentinel)
    run_ms = (time.perf_counter() - start) / args.runs * 1000
    base = fleet.evaluate(baseline)
    print(
        json.dumps(
            {
                "sentinel_ratio": round(sen.mean, 4),
                "baseline_ratio": round(base.mean, 4),
                "delta": round(sen.mean - base.mean, 4),
                "interruptions_mean": sen.mean_interruptions(),
                "young_daly_interval_s": round(sen.interval_s, 1),
                "checkpoint_cost_s": round(sen.model.checkpoint_cost_s, 3),
                "checkpoint_commit_lag_s": round(sen.model.checkpoint_commit_lag_s, 3),
                "run_ms": round(run_ms, 2),
                "measurements": f"{where} ({meas.date})",
            }
        )
    )


if __name__ == "__main__":
    main()
