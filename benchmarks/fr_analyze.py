"""fr_analyze_16k_s: `sentinel fr analyze` on 16,384 synthesized rank dumps with one culprit.

The dumps have PyTorch 2.10's NCCL shape (see `sentinel.fr.synth`): world, TP (8) and DP
groups, a ring buffer of `--buffer` entries per rank, one rank stopped before a TP all-reduce.
Timed: reading every dump (restricted unpickler) and the analysis, as the CLI does. Target:
<= 30 s with the right culprit. Last line of output: JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sentinel.fr import analyze, load_dir
from sentinel.fr.synth import write_job


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=16384)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--buffer", type=int, default=32)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--seed", type=int, default=5)
    args = p.parse_args()
    culprit = random.Random(args.seed).randrange(args.ranks)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        write_job(tmp, args.ranks, args.tp, args.steps, args.buffer, culprit, args.steps - 2)
        synth_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = analyze(load_dir(tmp, workers=args.workers))
        elapsed = time.perf_counter() - t0
    right = report.verdict == "hang" and report.culprit_ranks == [culprit]
    print(f"synthesized {args.ranks} dumps in {synth_s:.1f}s; analyzed in {elapsed:.2f}s")
    print(f"verdict={report.verdict} culprit={report.culprit_ranks} expected=[{culprit}]")
    print(
        json.dumps(
            {
                "fr_analyze_16k_s" if args.ranks == 16384 else "fr_analyze_s": round(elapsed, 3),
                "ranks": args.ranks,
                "entries_per_dump": args.buffer,
                "culprit_expected": culprit,
                "culprit_found": report.culprit_ranks,
                "right_culprit": right,
                "target_s": 30,
            }
        )
    )
    sys.exit(0 if right else 1)


if __name__ == "__main__":
    main()
