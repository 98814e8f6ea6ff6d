"""The token ledger: which samples each committed step trained on, and by whom; its checker.

A global batch is `microbatches` micro-batches of `mbs` rows (data.py: a row is a function of
the seed, the batch index and the row). Every step that commits appends one record to the
ledger of each gang that committed it (`OUT/ledger/replica-R.jsonl` for replica R of the
fault-tolerant mode, `OUT/ledger/gang.jsonl` for one gang), written by the gang's first rank:
the step, its global batch, the batches the skip list stepped over before it, the quorum, and
the whole step's assignment (replica -> micro-batch indices) as that gang saw it. A gang that
dies may miss its last record; its peers have it.

Records form a chain: each names the record of the step before (`prev`) and is named by a hash
of its content (`id`). The head travels with the training state (a checkpoint, a peer's state
sent to a joining replica), so the chain follows the state the model really has: a step redone
after a restart or a lost commit starts a new branch, and the branch the run ends on is the one
that counts. `check` walks that branch back from the last step and counts, in tokens (rows x
sequence length): expected (every micro-batch of every step), consumed, duplicated (consumed
more than once) and skipped (never consumed); records off the branch are `abandoned`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

LEDGER_DIR = "ledger"
TOKEN_KEYS = ("expected", "consumed", "duplicated", "skipped")


def assignment_key(assignment: Mapping[int, Sequence[int]]) -> dict[str, list[int]]:
    return {str(r): list(mbs) for r, mbs in sorted(assignment.items())}


@dataclass(frozen=True)
class Layout:
    """What one micro-batch is: `mbs` rows of `seq` trained tokens; `microbatches` per step."""

    microbatches: int
    mbs: int
    seq: int

    @property
    def microbatch_tokens(self) -> int:
        return self.mbs * self.seq


class LedgerWriter:
    """Appends this gang's committed steps; `head` is the id of the last record. Every rank of
    the gang keeps the head (it is part of the training state); one (`write`) appends."""

    def __init__(
        self, path: Path, layout: Layout, head: str | None, writer: str, write: bool = True
    ) -> None:
        self.path, self.layout, self.head, self.writer = path, layout, head, writer
        self.write = write
        self._file: TextIO | None = None

    def _open(self) -> TextIO:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a")
            layout = {"microbatches": self.layout.microbatches, "mbs": self.layout.mbs}
            self._write({"layout": layout | {"seq": self.layout.seq}, "writer": self.writer})
        return self._file

    def _write(self, line: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def record(
        self,
        step: int,
        batch: int,
        jumped: Iterable[int],
        quorum: int | None,
        assignment: Mapping[int, Sequence[int]],
    ) -> str:
        """Append the committed `step` and return its id (the new head)."""
        body = {
            "step": step,
            "batch": batch,
            "jumped": list(jumped),
            "quorum": quorum,
            "assignment": assignment_key(assignment),
            "prev": self.head,
        }
        rid = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:20]
        if self.write:
            self._open()
            self._write(body | {"id": rid, "writer": self.writer, "t": time.time()})
        self.head = rid
        return rid

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class Verdict:
    """What `check` found; the four counts are tokens (rows x sequence length)."""

    expected: int = 0  # every micro-batch of every step of the run
    consumed: int = 0  # on the counted branch, each time a micro-batch was trained
    duplicated: int = 0  # consumed beyond once
    skipped: int = 0  # expected and never consumed (a missing step counts whole)
    steps: int = 0  # steps on the counted branch
    abandoned: int = 0  # records off it (a branch a restart or a lost commit left)
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems and self.duplicated == 0 and self.skipped == 0

    def tokens(self) -> dict[str, int]:
        """The `tokens` object of a drill's result.json."""
        return {key: getattr(self, key) for key in TOKEN_KEYS}

    def to_json(self) -> dict[str, Any]:
        return self.tokens() | {
            "exact": self.exact,
            "steps": self.steps,
            "abandoned": self.abandoned,
            "problems": self.problems,
        }


def read_records(out: Path) -> tuple[dict[str, dict[str, Any]], set[Layout]]:
    """Every record of every ledger file under OUT (the union, by id), and their layouts."""
    records: dict[str, dict[str, Any]] = {}
    layouts: set[Layout] = set()
    for path in sorted((out / LEDGER_DIR).glob("*.jsonl")):
        for text in path.read_text().splitlines():
            try:
                line = json.loads(text)
            except json.JSONDecodeError:  # a writer killed mid-line
                continue
            if "layout" in line:
                layouts.add(Layout(**line["layout"]))
            elif "id" in line:
                records.setdefault(line["id"], line)
    return records, layouts


def _branch(records: dict[str, dict[str, Any]], steps: int, v: Verdict) -> list[dict[str, Any]]:
    """The records of the branch that ends at step `steps - 1` (or at the last step recorded,
    when that one is missing), oldest first."""
    last = max((r["step"] for r in records.values() if r["step"] < steps), default=None)
    if last is None:
        v.problems.append("no step recorded")
        return []
    if last != steps - 1:
        v.problems.append(f"no record of step {steps - 1} (the last recorded step is {last})")
    heads = {rid for rid, r in records.items() if r["step"] == last}
    if len(heads) > 1:
        v.problems.append(f"step {last} was committed {len(heads)} different ways")
    branch: list[dict[str, Any]] = []
    rid: str | None = min(heads)
    while rid is not None:
        rec = records.get(rid)
        if rec is None:
            v.problems.append(f"the record before step {branch[-1]['step']} is missing ({rid})")
            break
        if branch and rec["step"] != branch[-1]["step"] - 1:
            v.problems.append(f"step {branch[-1]['step']} follows step {rec['step']}")
        branch.append(rec)
        rid = rec["prev"]
    return branch[::-1]


def check(out: Path, steps: int) -> Verdict:
    """The ledger under OUT against a run of `steps` steps (see the module docstring)."""
    v = Verdict()
    records, layouts = read_records(out)
    if len(layouts) != 1:
        v.problems.append(f"want one layout in {out / LEDGER_DIR}, found {len(layouts)}")
        return v
    layout = layouts.pop()
    v.expected = steps * layout.microbatches * layout.microbatch_tokens
    branch = _branch(records, steps, v)
    v.steps, v.abandoned = len(branch), len(records) - len(branch)
    uses: Counter[tuple[int, int]] = Counter()  # (batch, micro-batch) -> times consumed
    batch = -1
    for rec in branch:
        jumped = list(range(batch + 1, rec["batch"]))
        if rec["jumped"] != jumped:
            v.problems.append(
                f"step {rec['step']}: batch {rec['batch']} after batch {batch} jumps {jumped}, "
                f"the skip list only {rec['jumped']}"
            )
        batch = rec["batch"]
        for mbs in rec["assignment"].values():
            uses.update((rec["batch"], m) for m in mbs)
    expected = {(rec["batch"], m) for rec in branch for m in range(layout.microbatches)}
    stray = set(uses) - expected
    if stray:
        v.problems.append(f"{len(stray)} micro-batches outside their step's batch")
    per_mb = layout.microbatch_tokens
    v.consumed = sum(uses.values()) * per_mb
    v.duplicated = sum(n - 1 for n in uses.values() if n > 1) * per_mb
    missing_steps = steps - len({rec["step"] for rec in branch if 0 <= rec["step"] < steps})
    v.skipped = (len(expected - set(uses)) + missing_steps * layout.microbatches) * per_mb
    return v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m trainer_hooks.reference.ledger",
        description="Check a run's token ledger: every sample of every step consumed exactly "
        "once. Exit 0 when exact, 1 when not, 2 on bad input.",
    )
    p.add_argument("out", type=Path, help="the run's --out directory")
    p.add_argument("--steps", type=int, required=True, help="the steps the run trained")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    ns = p.parse_args(argv)
    if ns.steps < 1 or not (ns.out / LEDGER_DIR).is_dir():
        print(f"error: want --steps >= 1 and a ledger in {ns.out / LEDGER_DIR}", file=sys.stderr)
        return 2
    v = check(ns.out, ns.steps)
    if ns.json:
        print(json.dumps(v.to_json()))
    else:
        t = v.tokens()
        print(" ".join(f"{k}={n}" for k, n in t.items()) + f" exact={v.exact}")
        for problem in v.problems:
            print(f"problem: {problem}")
    return 0 if v.exact else 1


if __name__ == "__main__":
    sys.exit(main())
