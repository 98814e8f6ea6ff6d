"""Checkpoint cost of the reference trainer, measured in one run.

1. One training run saves every `--every` steps, alternating synchronous `dcp.save` and
   `dcp.async_save` of the same state (`--checkpoint-mode alternate`). Rank 0 reports how long
   each save blocked the training loop (for an async save: starting it, plus the next step's
   wait for the background staging copy before its optimizer step); `async_block_ratio` =
   median async block / median sync block (target <= 0.1). The model is wider than the demo's
   so the state (model + AdamW, ~40 MB) is big enough for the write, not fixed overheads, to
   dominate.
2. The run is resumed from its latest checkpoint in a fresh gang; `resume_s` is the time from
   starting the processes to the first resumed step's metrics line (imports, rendezvous,
   DCP load included).

    python benchmarks/checkpoint.py [--ranks 2|8] [--dim 256] [--steps 12] [--every 2]

Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer_hooks.reference.launch import launch, read_metrics, run_gang  # noqa: E402


def checkpoint_lines(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [rec for rec in map(json.loads, lines) if "checkpoint" in rec]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, choices=[1, 2, 8], default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=2)
    ns = p.parse_args()
    layout = {1: [], 2: [], 8: ["--tp", "2", "--pp", "2"]}[ns.ranks]
    model = ["--dim", str(ns.dim), "--heads", "8", "--layers", "4", "--seq", "32", "--quiet"]
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        out = Path(tmp)
        common = [*layout, *model, "--out", str(out), "--checkpoint-every", str(ns.every)]
        run_gang(
            ns.ranks,
            [*common, "--steps", str(ns.steps), "--checkpoint-mode", "alternate"],
            log_dir=out / "logs",
            timeout=600,
        )
        saves = checkpoint_lines(out)[1:]  # the first save also pays one-time setup
        steps = read_metrics(out)[0]
        sync = [s["block_s"] for s in saves if s["sync"]]
        # An async save blocks while it starts, and the next step waits for its staging copy
        # before the optimizer step if the copy has not finished by then.
        asyn = [
            s["block_s"] + steps.get(s["checkpoint"] + 1, {}).get("ckpt_stall_s", 0.0)
            for s in saves
            if not s["sync"]
        ]
        metrics = out / "metrics.jsonl"
        seen = len(metrics.read_text().splitlines())
        t0 = time.monotonic()
        gang = launch(
            ns.ranks,
            [*common, "--steps", str(ns.steps + 2), "--resume-from", "latest"],
            log_dir=out / "logs-resume",
        )
        while not any('"step"' in line for line in metrics.read_text().splitlines()[seen:]):
            if any(p.poll() not in (None, 0) for p in gang.procs):
                raise SystemExit(f"resume failed:\n{gang.tail(0)}")
            time.sleep(0.01)
        resume_s = time.monotonic() - t0
        gang.wait(600)
    result = {
        "ranks": ns.ranks,
        "state_mb": round((ns.dim**2 * 12 * 4 + ns.dim * 256 * 2 + ns.dim * 32) * 4 * 3 / 1e6, 1),
        "sync_block_s_p50": round(statistics.median(sync), 4),
        "async_block_s_p50": round(statistics.median(asyn), 4),
        "async_block_ratio": round(statistics.median(asyn) / statistics.median(sync), 4),
        "async_wait_for_previous_s_max": round(max(s["wait_s"] for s in saves), 4),
        "resume_s": round(resume_s, 2),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
