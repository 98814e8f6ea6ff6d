"""Goodput simulator benchmark: the Llama 3 reference trace, Sentinel vs no Sentinel, and the
repair paths side by side at 16,384 and 100,000 GPUs.

    python benchmarks/goodput.py [--runs N] [--measurements FILE] [--recovery-bench FILE]

The inputs are `sentinel goodput`'s with no flags: Sentinel's times from the drill measurements
(default: the copy shipped in `sentinel/data/goodput_measurements.json`, made by
`benchmarks/goodput_measurements.py`), the live path's from `benchmarks/recovery.py`'s output
where given, the rest its named assumptions; spares by the rule at each size.

Prints a JSON object as the last line: `sentinel_ratio`, `baseline_ratio` and `delta` (mean
effective training time ratio over `--runs` seeds at 16,384 GPUs, each fault on the catalog's
path, same failures for both), `interruptions_mean` (vs the trace's 419),
`young_daly_interval_s`, `checkpoint_cost_s` and `checkpoint_commit_lag_s` (derived by
`sentinel/lab/goodput/checkpoint.py`), `run_ms` (one simulated 54-day run of 16,384 GPUs, wall clock,
mean), and `by_size`: per fleet size, the spares and the ratio of the baseline, today's restart,
the warm restart and the live configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sentinel.lab.goodput.compare import compare, rule_spares  # noqa: E402
from sentinel.lab.goodput.inputs import Plan, build_models, default_rows  # noqa: E402
from sentinel.lab.goodput.measurements import read_measurements  # noqa: E402
from sentinel.lab.goodput.recovery_bench import read_recovery_bench  # noqa: E402
from sentinel.lab.goodput.simulate import Fleet  # noqa: E402
from sentinel.lab.goodput.trace import LLAMA3  # noqa: E402

SIZES = (16384, 100000)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--measurements", type=Path, help="default: the shipped measurements")
    ap.add_argument("--recovery-bench", type=Path, help="benchmarks/recovery.py's output")
    args = ap.parse_args()
    meas, where = read_measurements(args.measurements)
    bench, bench_where = read_recovery_bench(args.recovery_bench)
    values = {r.key: r.value for r in default_rows(meas, where, bench, bench_where)}
    gpus = LLAMA3.gpus
    plan = Plan(
        gpus=gpus, spares=rule_spares(LLAMA3, gpus, values), interval_s=None, asynchronous=True
    )
    sentinel, baseline, _spec = build_models(values, plan)
    seeds = list(range(args.runs))
    fleet = Fleet(LLAMA3, gpus=gpus, days=LLAMA3.days, seeds=seeds)
    start = time.perf_counter()
    sen = fleet.evaluate(sentinel)
    run_ms = (time.perf_counter() - start) / args.runs * 1000
    base = fleet.evaluate(baseline)
    points = compare(LLAMA3, values, plan, SIZES, LLAMA3.days, seeds, fixed_spares=None)
    by_size = {
        str(p.layout.gpus): {
            "spares": p.spares,
            "baseline": round(p.baseline.mean, 4),
            **{str(r): round(s.mean, 4) for r, s in p.paths.items()},
        }
        for p in points
    }
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
                "by_size": by_size,
                "measurements": f"{where} ({meas.date})",
                "live_times": bench_where,
            }
        )
    )


if __name__ == "__main__":
    main()
