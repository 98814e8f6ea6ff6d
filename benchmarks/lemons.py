"""Lemon scoring in the goodput simulator (sentinel/lab/goodput/lemons.py).

    python benchmarks/lemons.py [--runs N]

Two questions, each on the same failures with and without lemon scoring (mean of `--runs`
seeds, 180 days of one job on 60 nodes with 3 hot spares):

- `lemons`: 3 of the 63 nodes fail 20x as often (they cause half of all exclusions, as in one
  504-GPU B200 fleet); 70% of failures carry hardware evidence. Does keeping a node with a
  high score out for a deep repair reduce the job's lost hours?
- `uncertain`: no lemons, and no failure carries hardware evidence (hangs: the blame lands on
  the culprit's node only 30% of the time). Does the score ever retire an innocent node?

Prints a JSON object as the last line: per question `lost_h_without`, `lost_h_with`,
`interruptions_without`, `interruptions_with`, `retired_lemons`, `retired_innocent` (means per
run), and `runs`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sentinel.lab.goodput.lemons import LemonFleet, LemonPolicy, compare  # noqa: E402

QUESTIONS = {
    "lemons": LemonFleet(),
    "uncertain": LemonFleet(lemons=0, hardware_share=0.0, uncertain_hit=0.3),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    seeds = list(range(args.runs))
    out = {
        name: {
            k: round(v, 3) if isinstance(v, float) else v
            for k, v in dataclasses.asdict(compare(fleet, LemonPolicy(), seeds)).items()
        }
        for name, fleet in QUESTIONS.items()
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
