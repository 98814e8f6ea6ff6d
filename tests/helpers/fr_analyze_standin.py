"""A stand-in for `sentinel fr analyze DIR --json` reading the toy trainer's flight records.

The toy records hold the last collective sequence number each rank reached; the ranks that are
behind the others are where the gang is stuck. Prints the same JSON keys as the real analyzer
(`verdict`, `culprit_ranks`, `waiting_ranks`) and exits 1 when it finds a hang.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    records = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("rank*.json"))]
    seqs = {int(r["rank"]): int(r["seq"]) for r in records}
    low = min(seqs.values(), default=0)
    culprits = sorted(r for r, s in seqs.items() if s == low)
    if not seqs or len(culprits) == len(seqs):
        print(json.dumps({"verdict": "ok", "culprit_ranks": [], "waiting_ranks": []}))
        return 0
    waiting = sorted(set(seqs) - set(culprits))
    print(json.dumps({"verdict": "hang", "culprit_ranks": culprits, "waiting_ranks": waiting}))
    return 1


if __name__ == "__main__":
    sys.exit(main())
