"""Phase 2: find the bad node or cable, which a fleet-wide collective average cannot.

Two searches over node leaders (the lowest rank of each node):
- circle: the round-robin tournament schedule, n-1 rounds of n/2 concurrent pairs, measures
  every node pair once and keeps the matrix; each node's score is the upper median of its links,
  judged against the median node score (a bad node drags down all of its own links but only
  one of anybody else's).
- bisection: for large fleets, ceil(log2 n) rounds. Each round splits the suspects in two halves
  and runs a ring exchange in each half at the same time; the half that is clearly slower holds
  the bad node; the other half is cleared and lends members to pad later, smaller groups.
Intra-node pairs (local ranks 0-1, 2-3, ...) are measured in one extra round.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sentinel.burnin.comm import Comm
from sentinel.burnin.settings import Thresholds
from sentinel.stats import MAD_SCALE, mad, median, upper_median, variance

Pair = tuple[str, str]


def circle_rounds(nodes: Sequence[str]) -> list[list[Pair]]:
    """Round-robin schedule: every pair exactly once, no node twice in a round."""
    ring: list[str | None] = list(nodes)
    if len(ring) % 2:
        ring.append(None)  # a bye
    n = len(ring)
    rounds = []
    for _ in range(n - 1):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def bisection_round_bound(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


# --- measurement (inside ranks) -------------------------------------------------------------


class _Exchange:
    """This rank's part of ring exchanges: send to the next member, receive from the previous.

    One pair of buffers serves every ring this rank is in."""

    def __init__(self, comm: Comm, nbytes: int) -> None:
        count = max(1, nbytes // 4)
        self.comm = comm
        self.send = torch.ones(count, device=comm.device)
        self.recv = torch.empty(count, device=comm.device)

    def seconds(self, ring: Sequence[int]) -> float:
        i = ring.index(self.comm.rank)
        dst, src = ring[(i + 1) % len(ring)], ring[(i - 1) % len(ring)]
        self.comm.sync()
        t0 = time.perf_counter()
        self.comm.sendrecv(self.send, dst, self.recv, src)
        self.comm.sync()
        return time.perf_counter() - t0


def measure_rounds(
    comm: Comm,
    rounds: Sequence[Sequence[Sequence[int]]],
    nbytes: int,
    trials: int,
    take_turns: bool = False,
    on_trial: Callable[[int], None] | None = None,
) -> list[list[float]]:
    """Rounds of rings; a round's rings exchange at once. GB/s per ring, its slowest member's.

    Each rank keeps its best trial of each ring. A trial passes over every round, so one ring's
    trials are spread over the whole measurement: a burst of unrelated load spoils some trials
    of every ring, not all trials of the rings that happened to run during it (a round's worth
    of trials lasts a few tens of milliseconds on a simulated fleet: one descheduled rank
    spoiled them all and put a healthy node 40% under its peers).
    `take_turns` runs a round's rings one after the other: when every "node" shares one host's
    CPUs (a simulated fleet, namespaces), concurrent rings would measure CPU contention, not
    links.
    """
    exchange = _Exchange(comm, nbytes)
    mine = [next((i for i, r in enumerate(rnd) if comm.rank in r), None) for rnd in rounds]
    for rnd, i in zip(rounds, mine, strict=True):
        if i is not None:
            exchange.seconds(rnd[i])  # warm each path
    best = [math.inf if i is not None else 0.0 for i in mine]
    for trial in range(trials):
        for k, rnd in enumerate(rounds):
            for turn, ring in enumerate(rnd):
                if take_turns or turn == 0:
                    comm.barrier()
                if turn == mine[k]:
                    best[k] = min(best[k], exchange.seconds(ring))
        if on_trial is not None:
            on_trial(trial)
    everyone = comm.gather_objects(best)
    return [
        [nbytes / max(everyone[r][k] for r in ring) / 1e9 for ring in rnd]
        for k, rnd in enumerate(rounds)
    ]


def leaders(node_of: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rank, node in enumerate(node_of):
        out.setdefault(node, rank)
    return out


def intra_pairs(node_of: Sequence[str]) -> list[tuple[str, int, int]]:
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(node_of):
        by_node.setdefault(node, []).append(rank)
    return [
        (node, ranks[i], ranks[i + 1])
        for node, ranks in by_node.items()
        for i in range(0, len(ranks) - 1, 2)
    ]


# --- bisection (pure search over a measuring function) --------------------------------------


@dataclass
class Bisection:
    found: str | None = None
    rounds: int = 0
    trace: list[dict[str, object]] = field(default_factory=list)
    note: str = ""


def bisect(
    nodes: Sequence[str],
    measure: Callable[[list[list[str]]], list[float]],
    tolerance: float,
) -> Bisection:
    """Find one bad node in ceil(log2 n) rounds; `measure` runs groups concurrently, GB/s each."""
    out = Bisection()
    if len(nodes) < 4:
        out.note = "bisection needs 4 or more nodes; use the circle search"
        return out
    suspects, cleared = list(nodes), list[str]()
    while len(suspects) > 1:
        halves = [suspects[: len(suspects) // 2], suspects[len(suspects) // 2 :]]
        spare = iter(cleared)
        groups = [h if len(h) > 1 else [*h, next(spare)] for h in halves]
        gbps = measure(groups)
        out.rounds += 1
        slow = [g < max(gbps) * (1 - tolerance) for g in gbps]
        out.trace.append({"groups": groups, "gbps": [round(g, 4) for g in gbps], "slow": slow})
        if slow[0] == slow[1]:
            out.note = (
                "both halves slow: more than one bad node, run the circle search"
                if slow[0]
                else "no half slower than the other: no single bad node"
            )
            return out
        suspects, good = (halves[0], halves[1]) if slow[0] else (halves[1], halves[0])
        cleared.extend(good)
    out.found = suspects[0]
    return out


# --- judgement (rank 0) ---------------------------------------------------------------------


MIN_SAMPLES_FOR_SPREAD = 5


def _spread(values: Sequence[float], th: Thresholds) -> float:
    """k robust deviations, once there are enough values to estimate one; else no gate."""
    return (
        th.link_mad_k * mad(values, scale=MAD_SCALE)
        if len(values) >= MIN_SAMPLES_FOR_SPREAD
        else 0.0
    )


@dataclass
class LinkVerdicts:
    rows: list[dict[str, Any]]
    node_reasons: dict[str, list[str]]
    reference_gbps: float
    node_scores: dict[str, float]


def judge_matrix(
    nodes: Sequence[str],
    matrix: dict[Pair, float],
    th: Thresholds,
    baseline: dict[str, float] | None = None,
) -> LinkVerdicts:
    """Flag nodes whose links sit well under the fleet's (or under their saved baseline).

    Each node is judged against the links that do not touch it (leave one out): in a small
    fleet a bad node's own links would otherwise be a large share of the reference and spread.
    """
    touching = {n: [(p, g) for p, g in matrix.items() if n in p] for n in nodes}
    scores = {n: upper_median([g for _, g in ps]) for n, ps in touching.items() if ps}
    if not scores:
        return LinkVerdicts([], {}, 0.0, {})
    fleet = median(list(matrix.values()))
    reasons: dict[str, list[str]] = {}
    floors: dict[str, float] = {}
    for node, score in scores.items():
        others = [g for p, g in matrix.items() if node not in p]
        ref = median(others) if others else score
        floor = floors[node] = ref * (1 - th.link_tolerance)
        if others and score < floor and ref - score > _spread(others, th):
            slow = sorted((g, p) for p, g in touching[node] if g < floor)
            peers = ", ".join(f"{a if b == node else b} {g:.3f}" for g, (a, b) in slow)
            reasons.setdefault(node, []).append(
                f"links: median {score:.3f} GB/s vs {ref:.3f} GB/s among the other nodes "
                f"(floor {floor:.3f}); {len(slow)}/{len(touching[node])} links slow: {peers}"
            )
        base = (baseline or {}).get(node)
        if base and variance(score, base) < -th.baseline_tolerance:
            reasons.setdefault(node, []).append(
                f"links: {score:.3f} GB/s is {variance(score, base):+.0%} "
                f"against baseline {base:.3f}"
            )
    rows = [
        {
            "a": a,
            "b": b,
            "gbps": round(g, 4),
            "verdict": "fail" if any(n in reasons and g < floors[n] for n in (a, b)) else "pass",
        }
        for (a, b), g in sorted(matrix.items())
    ]
    return LinkVerdicts(rows, reasons, fleet, scores)


def judge_intra(pairs: list[tuple[str, int, int, float]], th: Thresholds) -> LinkVerdicts:
    """Intra-node pairs against the median intra-node pair."""
    if not pairs:
        return LinkVerdicts([], {}, 0.0, {})
    values = [g for *_, g in pairs]
    rows: list[dict[str, Any]] = []
    reasons: dict[str, list[str]] = {}
    for i, (node, a, b, g) in enumerate(pairs):
        others = values[:i] + values[i + 1 :]
        ref = median(others) if others else g
        bad = bool(others) and g < ref * (1 - th.link_tolerance)
        bad = bad and ref - g > _spread(others, th)
        rows.append(
            {
                "node": node,
                "ranks": [a, b],
                "gbps": round(g, 4),
                "verdict": "fail" if bad else "pass",
            }
        )
        if bad:
            reasons.setdefault(node, []).append(
                f"intra-node ranks {a}<->{b}: {g:.3f} GB/s vs fleet {ref:.3f} GB/s"
            )
    return LinkVerdicts(rows, reasons, median(values), {})
