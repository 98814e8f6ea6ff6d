"""A tiny real training loop for supervisor tests (plain Python, no torch).

Every rank steps a deterministic "model" (one float); rank 0 writes `step_N.json` checkpoints.
It honours the supervisor's flags: --resume-from, --skip-batches A-B,..., --lr-scale F:N, and
logs what it did to OUT/g<generation>-rank<r>.json so tests can check it.
Fault injection for tests: TOY_CRASH="RANK:STEP:GENERATION[,..]" makes that rank exit 3 there;
TOY_HANG="RANK:STEPS:GENERATION" stops that rank STEPS steps after it started (a stuck
collective: it stays alive, stops advancing). Each rank follows SENTINEL_CONTROL_FILE: on
`fr.dump` it writes a toy flight record, `<fr-dir>/rank<R>.json` = {"rank", "seq"}, the last
collective sequence number it reached.

The ranks step together, as a real gang's collectives make them (`Lockstep`): a rank cannot run
ahead of a dead or stuck peer, so a crash's generation commits no checkpoint its dead rank
never reached, however the ranks' starts are spread on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


class Control:
    """New lines of the supervisor's control file since the last look."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.offset = self.path.stat().st_size if self.path and self.path.exists() else 0

    def new(self) -> list[dict[str, object]]:
        if self.path is None or not self.path.exists():
            return []
        with self.path.open() as f:
            f.seek(self.offset)
            text = f.read()
        self.offset += len(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]


class Lockstep:
    """Each rank's last finished step in OUT/lockstep-g<generation>/rank<r>; a rank starts a
    step once every rank of the gang has finished the one before (and has started)."""

    def __init__(self, out: Path, generation: int, rank: int, world: int) -> None:
        self.dir, self.rank, self.world = out / f"lockstep-g{generation}", rank, world
        self.dir.mkdir(parents=True, exist_ok=True)

    def finished(self, step: int) -> None:
        tmp = self.dir / f".rank{self.rank}.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, self.dir / f"rank{self.rank}")

    def may_start(self, step: int) -> bool:
        for r in range(self.world):
            try:
                if int((self.dir / f"rank{r}").read_text()) < step:
                    return False
            except (FileNotFoundError, ValueError):
                return False
        return True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--resume-from", type=Path)
    p.add_argument("--skip-batches", default="")
    p.add_argument("--lr-scale", default="")
    p.add_argument("--fr-dir", type=Path)
    a = p.parse_args()
    rank, gen = int(os.environ["RANK"]), int(os.environ["SENTINEL_GENERATION"])
    node = os.environ["SENTINEL_NODE"]
    crashes = {
        tuple(map(int, c.split(":"))) for c in os.environ.get("TOY_CRASH", "").split(",") if c
    }
    skip = set()
    for part in filter(None, a.skip_batches.split(",")):
        lo, hi = map(int, part.split("-"))
        skip.update(range(lo, hi + 1))
    step, value = 0, 1.0
    if a.resume_from:
        state = json.loads(a.resume_from.read_text())
        step, value = state["step"], state["value"]
    start = step
    a.ckpt_dir.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "node": node,
        "generation": gen,
        "start": start,
        "end": None,
        "world": int(os.environ["WORLD_SIZE"]),
        "skip": sorted(skip),
        "lr": a.lr_scale,
        "resume_from": str(a.resume_from) if a.resume_from else None,
        "socket": os.environ.get("SENTINEL_RANK_SOCKET"),
    }
    (a.out / f"g{gen}-rank{rank}.json").write_text(json.dumps(record))
    hang = os.environ.get("TOY_HANG", "")
    hang_rank, hang_after, hang_gen = map(int, hang.split(":")) if hang else (-1, 0, -1)
    control = Control(os.environ.get("SENTINEL_CONTROL_FILE"))
    gang = Lockstep(a.out, gen, rank, int(os.environ["WORLD_SIZE"]))
    gang.finished(step)
    while step < a.steps:
        for cmd in control.new():
            if cmd["kind"] == "fr.dump" and a.fr_dir is not None:
                a.fr_dir.mkdir(parents=True, exist_ok=True)
                (a.fr_dir / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "seq": step}))
        if not gang.may_start(step):  # waiting on a peer, as in a collective
            time.sleep(0.01)
            continue
        if (rank, gen) == (hang_rank, hang_gen) and step >= start + hang_after:
            time.sleep(a.step_s)  # stuck in a collective that never completes
            continue
        if (rank, step, gen) in crashes:
            return 3
        if step not in skip:
            value = value * 0.99 + 0.01 * step
        step += 1
        if rank == 0 and step % a.ckpt_every == 0:
            tmp = a.ckpt_dir / f"step_{step}.json.tmp"
            tmp.write_text(json.dumps({"step": step, "value": value}))
            os.replace(tmp, a.ckpt_dir / f"step_{step}.json")
        gang.finished(step)
        time.sleep(a.step_s)
    record.update(end=step, value=value)
    (a.out / f"g{gen}-rank{rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
