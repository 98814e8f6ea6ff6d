"""Step time of the reference trainer's demo configuration: TP2 x PP2 x DP2 on 8 CPU ranks.

Launches the real gang (`python -m trainer_hooks.reference.train` per rank, gloo) and reads the
per-step `step_s` that rank 0 writes. The first steps (warm-up: lazy init, first collectives)
are dropped. Last line: JSON with `step_s_p50`.

    python benchmarks/trainer.py [--steps 14] [--warmup-steps 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stats import median, percentile  # noqa: E402  (benchmarks/stats.py)

from trainer_hooks.reference.launch import read_metrics, run_gang  # noqa: E402

DEMO = ["--tp", "2", "--pp", "2", "--mbs", "2", "--accum", "2", "--quiet"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--warmup-steps", type=int, default=4)
    ns = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        out = Path(tmp)
        t0 = time.monotonic()
        run_gang(
            8,
            [*DEMO, "--out", str(out), "--steps", str(ns.steps)],
            log_dir=out / "logs",
            timeout=600,
        )
        wall = time.monotonic() - t0
        steps, _ = read_metrics(out)
    times = [steps[s]["step_s"] for s in sorted(steps) if s > ns.warmup_steps]
    result = {
        "config": "tp2 pp2 dp2, 8 ranks, gloo/CPU, layers 4 dim 64 seq 32, global batch 8",
        "steps_timed": len(times),
        "step_s_p50": round(median(times), 4),
        "step_s_p90": round(percentile(times, 0.9), 4),
        "tokens_per_s": round(8 * 32 / median(times), 1),
        "gang_wall_s": round(wall, 1),
        "first_loss": steps[1]["loss"],
        "last_loss": steps[max(steps)]["loss"],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
