"""What the replays came to, against the corpus's labels: per playbook and per agent rule.

A playbook's incident is a true one when its stream expects that fault on that node (the first
such incident; a second is false), and false otherwise; an expected incident that never opened
is a miss. An agent rule's unhealthy verdict on a node is true when its stream expects an
incident on that node, false otherwise (every verdict on a benign stream's nodes is false).
Precision is true / (true + false), recall true / (true + missed); None where nothing counts.
Detection latency: from the first thing that struck the node to the incident's opening.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from sentinel.coordinator.core.playbooks import Playbook
from sentinel.precision.corpus import MIN_PRECISION, MIN_RECALL, PROCESS_EVENTS, Stream
from sentinel.precision.replay import Replayed


@dataclass
class Tally:
    true: int = 0
    false: int = 0
    missed: int = 0
    latency_s: list[float] = field(default_factory=list)
    actions: Counter[str] = field(default_factory=Counter)
    false_in: list[str] = field(default_factory=list)  # the streams of the false ones

    def count(self, true: bool, stream: Stream, target: str, at: float) -> None:
        """One incident or verdict on `target` at `at` (stream seconds), true or false; a
        true one's latency runs from the last thing that struck its target."""
        if not true:
            self.false += 1
            self.false_in.append(stream.name)
            return
        self.true += 1
        began = _last_strike(stream, target, at)
        if began is not None:
            self.latency_s.append(round(at - began, 3))

    @property
    def precision(self) -> float | None:
        n = self.true + self.false
        return round(self.true / n, 4) if n else None

    @property
    def recall(self) -> float | None:
        n = self.true + self.missed
        return round(self.true / n, 4) if n else None

    def doc(self) -> dict[str, Any]:
        lat = sorted(self.latency_s)
        return {
            "true": self.true,
            "false": self.false,
            "missed": self.missed,
            "precision": self.precision,
            "recall": self.recall,
            "latency_s": {"min": lat[0], "max": lat[-1]} if lat else None,
            "actions": dict(sorted(self.actions.items())),
            "false_in": sorted(set(self.false_in)),
        }


@dataclass(frozen=True)
class Destructive:
    stream: str
    playbook: str | None
    target: str
    actions: tuple[str, ...]


@dataclass
class Score:
    streams: int
    benign: int
    faults: int
    playbooks: dict[str, Tally]
    rules: dict[str, Tally]
    destructive_on_benign: list[Destructive]
    expected: int
    found: int

    @property
    def recall(self) -> float | None:
        return round(self.found / self.expected, 4) if self.expected else None

    @property
    def held(self) -> bool:
        """No destructive action on a benign stream, and the faults' recall at its bar."""
        recall = self.recall
        return not self.destructive_on_benign and (recall is None or recall >= MIN_RECALL)

    def doc(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "benign": self.benign,
            "faults": self.faults,
            "recall": self.recall,
            "destructive_on_benign": [asdict(d) for d in self.destructive_on_benign],
            "held": self.held,
            "bars": {"precision": MIN_PRECISION, "recall": MIN_RECALL},
            "playbooks": {k: t.doc() for k, t in sorted(self.playbooks.items())},
            "rules": {k: t.doc() for k, t in sorted(self.rules.items())},
        }


def score(replays: list[Replayed], playbooks: list[Playbook]) -> Score:
    """`playbooks`: the ones replayed (a missed incident counts against its fault's)."""
    opens = {b.incident.fault: b.name for b in reversed(playbooks)}  # the first by priority
    books: dict[str, Tally] = defaultdict(Tally)
    rules: dict[str, Tally] = defaultdict(Tally)
    destructive: list[Destructive] = []
    expected = found = 0
    for r in replays:
        s = r.stream
        want = list(s.expect)
        expected += len(want)
        for inc in r.incidents:
            tally = books[inc.playbook or inc.fault]
            tally.actions.update(inc.actions)
            match = next((e for e in want if e.matches(inc.fault, inc.target)), None)
            if match is not None:
                want.remove(match)
                found += 1
            target = match.target if match else inc.target
            tally.count(match is not None, s, target, inc.opened_s)
            if s.label == "benign" and inc.destructive:
                destructive.append(Destructive(s.name, inc.playbook, inc.target, inc.destructive))
        for e in want:  # expected, never opened
            books[opens.get(e.fault, e.fault)].missed += 1
        troubled = {e.target for e in s.expect}
        for f in r.firings:
            rules[f.rule].count(f.node in troubled, s, f.node, f.t)
    benign = sum(r.stream.label == "benign" for r in replays)
    return Score(
        len(replays),
        benign,
        len(replays) - benign,
        dict(books),
        dict(rules),
        destructive,
        expected,
        found,
    )


def _last_strike(stream: Stream, target: str, by: float) -> float | None:
    """When `target` (a node, or `job`: any node) was last struck before `by` (not by a
    process event): where a detection's latency is counted from."""
    times = [
        h.t
        for h in stream.events
        if h.t <= by and h.kind not in PROCESS_EVENTS and target in ("job", h.node)
    ]
    return max(times, default=None)
