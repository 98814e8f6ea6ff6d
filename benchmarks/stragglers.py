"""Runtime straggler detection in the reference trainer, at the hooks' shipped defaults.

Per layout, on real gloo ranks of the demo's tiny model (`tests/hooks_support/straggler_runs`,
where each pipeline stage's ranks share a core, and why):
- sensitivity: `--runs` runs in which one rank's device does `slowdown` times the work from
  step `--onset` on (real extra matrix products, never a sleep); a run counts as detected when
  that rank, and no other, is named within 100 steps of the onset. Reported: detected runs,
  each run's latency in steps, and every rank wrongly named.
- false positives: one clean run of `--clean-steps` steps; every rank named in it is one.

`--unpinned` leaves the ranks where the machine places them (the tests' and the default runs'
pinning is what the harness's docstring explains).

The targets: TP2 x PP2 x DP2 with a rank slowed 1.10x, DP-only with 4 ranks slowed 1.05x, each
named within 100 steps, and no rank named over 1,000 clean steps. Timings on a shared machine
are noisy; the JSON says what the load was.

    python benchmarks/stragglers.py [--runs 5] [--clean-steps 1000] [--layouts 2x2x2,1x1x4]
                                    [--onset 200] [--unpinned]

Last line: JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.hooks_support.straggler_runs import Layout, run  # noqa: E402

TARGETS = {"2x2x2": (5, 1.10), "1x1x4": (2, 1.05)}  # layout: (slowed rank, slowdown)
WITHIN = 100


def sensitivity(layout: Layout, runs: int, onset: int, pin: bool) -> dict[str, object]:
    rank, slowdown = TARGETS[str(layout)]
    fault = f"straggler:rank={rank},slowdown={slowdown},at_step={onset}"
    latencies: list[int | None] = []
    wrong: list[int] = []
    for _ in range(runs):
        named = run(layout, onset + WITHIN + 5, fault, pin=pin)
        wrong += [n.rank for n in named if n.rank != rank or n.step < onset]
        hits = [n.step - onset for n in named if n.rank == rank and n.step >= onset]
        latencies.append(min(hits) if hits and min(hits) <= WITHIN else None)
        print(f"{layout} slowed run: named {named}", file=sys.stderr, flush=True)
    return {
        "slowed_rank": rank,
        "slowdown": slowdown,
        "runs": runs,
        "detected_within_100": sum(x is not None for x in latencies),
        "latency_steps": latencies,
        "wrongly_named": wrong,
    }


def false_positives(layout: Layout, steps: int, pin: bool) -> dict[str, object]:
    named = run(layout, steps, timeout=max(900.0, steps * 2.0), pin=pin)
    print(f"{layout} clean run: named {named}", file=sys.stderr, flush=True)
    falsely = [dataclasses.asdict(n) for n in named]
    return {"clean_steps": steps, "false_positives": len(named), "falsely_named": falsely}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    # the tests' onset: 200 clean steps first (the ranks' normals are set in the first 60)
    p.add_argument("--onset", type=int, default=200, help="the slowdown's first step")
    p.add_argument("--clean-steps", type=int, default=1000)
    p.add_argument("--layouts", default=",".join(TARGETS))
    p.add_argument("--unpinned", action="store_true", help="ranks where the machine puts them")
    args = p.parse_args()
    pin = not args.unpinned
    result: dict[str, object] = {"load_before": round(os.getloadavg()[0], 2), "pinned": pin}
    t0 = time.monotonic()
    for text in args.layouts.split(","):
        layout = Layout.parse(text)
        entry = sensitivity(layout, args.runs, args.onset, pin) if args.runs else {}
        if args.clean_steps:
            entry |= false_positives(layout, args.clean_steps, pin)
        result[str(layout)] = entry
    result |= {"wall_s": round(time.monotonic() - t0), "load_after": round(os.getloadavg()[0], 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
