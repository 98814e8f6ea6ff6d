"""Group ranks by their stacks: identical stacks together, the odd ones out first.

Pure logic over the ranks' `rank.stacks` answers, shared by the coordinator (which serves the
groups and saves them with a hang incident) and the command line. Two ranks are in one group
when every thread of one has a thread of the same name with the same frames (file, line,
function) in the other: the code line's text and the process id do not count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sentinel.protocol import RankStacksPayload, ThreadStack

Signature = tuple[tuple[str, tuple[tuple[str, int | None, str], ...]], ...]


@dataclass
class StackGroup:
    """Ranks sharing one set of stacks; `threads` are the first such rank's."""

    ranks: list[int]
    threads: list[ThreadStack]

    def as_json(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "ranks_text": rank_ranges(self.ranks),
            "threads": [t.model_dump(mode="json") for t in self.threads],
        }


@dataclass
class Grouped:
    """The answer to one stacks request: groups (odd ones out first) and the silent ranks."""

    world_size: int
    groups: list[StackGroup] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # ranks of the job that did not answer

    @property
    def answered(self) -> int:
        return sum(len(g.ranks) for g in self.groups)

    def as_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "answered": self.answered,
            "missing_ranks": self.missing,
            "missing_text": rank_ranges(self.missing),
            "groups": [g.as_json() for g in self.groups],
        }


def signature(threads: Iterable[ThreadStack]) -> Signature:
    return tuple((t.name, tuple((f.file, f.line, f.func) for f in t.frames)) for t in threads)


def group(answers: Iterable[tuple[int, RankStacksPayload]], world_size: int) -> Grouped:
    """Group the answers (rank, stacks) of a job of `world_size` ranks. A rank that answered
    twice (a command delivered again) counts once, with its first answer. The smallest groups
    come first (the odd ones out), then by their lowest rank."""
    by_sig: dict[Signature, StackGroup] = {}
    seen: set[int] = set()
    for rank, payload in answers:
        if rank in seen:
            continue
        seen.add(rank)
        sig = signature(payload.threads)
        found = by_sig.get(sig)
        if found is None:
            by_sig[sig] = StackGroup([rank], list(payload.threads))
        else:
            found.ranks.append(rank)
    groups = list(by_sig.values())
    for g in groups:
        g.ranks.sort()
    groups.sort(key=lambda g: (len(g.ranks), g.ranks[0]))
    missing = [r for r in range(world_size) if r not in seen]
    return Grouped(world_size, groups, missing)


def rank_ranges(ranks: Sequence[int]) -> str:
    """`0-5,7`: sorted ranks as runs of consecutive numbers."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)
