"""Lemon nodes: does keeping a node that keeps failing out of the spare pool pay, and does it
spare the innocent when the blame is uncertain?

A node-level replay of one job on a fleet. Each node fails at its own rate while it trains (a
lemon at many times the others'); every failure interrupts the job (detection, restart and the
work since the last checkpoint: `cost_s`), and the node the repair blames is evicted, swapped
for a spare and repaired, then returns to the pool. When no spare is free the job waits for the
first repaired node. Blame is certain for a fault with hardware evidence (the agent's ECC, XID,
thermal readings name the GPU) and uncertain otherwise (a hang: the culprit's node only with
probability `uncertain_hit`, else another node of the gang).

The ordinary repair (a reset, a reboot, reseating: `repair_s`) does not cure a lemon: it comes
back as bad as it left. With lemon scoring each incident adds its confidence to the blamed
node's score (hardware evidence 1.0, "it was in the gang when the job hung" 0.25); a node whose
score over the window reaches the threshold is kept out of the spare pool until a person clears
it, after a deep repair (parts replaced: `deep_repair_s`) that does cure it. The weights, the
threshold and the score are the coordinator's own (`sentinel.faults.blame`).
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections import deque
from dataclasses import dataclass, field

from sentinel.faults.blame import (
    DAY_S,
    HIGH_CONFIDENCE,
    LOW_CONFIDENCE,
    LemonPolicy,
    lemon_score,
)


@dataclass(frozen=True)
class LemonFleet:
    """One job on `job_nodes` nodes with `spares` hot spares; `lemons` of the nodes fail at
    `lemon_factor` times the base rate (one failure per `node_mtbf_days` of training)."""

    job_nodes: int = 60
    spares: int = 3
    lemons: int = 3
    lemon_factor: float = 20.0
    node_mtbf_days: float = 263.0  # Llama 3's 419 interruptions in 54 days on 2,048 8-GPU nodes
    hardware_share: float = 0.7  # failures with hardware evidence (certain blame)
    uncertain_hit: float = 0.5  # an uncertain blame lands on the culprit's node this often
    repair_s: float = 12 * 3600.0
    deep_repair_s: float = 7 * DAY_S  # a person's diagnosis and parts replaced, then cleared
    cost_s: float = 1800.0  # one interruption: detect, restart, work since the last checkpoint
    days: float = 180.0


@dataclass
class Outcome:
    lost_s: float = 0.0  # interruptions' cost plus waiting for a spare
    wait_s: float = 0.0
    interruptions: int = 0
    retired: list[int] = field(default_factory=list)  # kept out for a deep repair

    def retired_innocent(self, lemons: int) -> int:
        return sum(1 for n in self.retired if n >= lemons)

    def retired_lemons(self, lemons: int) -> int:
        return sum(1 for n in self.retired if n < lemons)


def replay(fleet: LemonFleet, policy: LemonPolicy, seed: int) -> Outcome:
    """One seeded run; nodes 0 .. lemons-1 are the lemons."""
    rng = random.Random(seed)
    total = fleet.job_nodes + fleet.spares
    base = 1.0 / (fleet.node_mtbf_days * DAY_S)
    rate = [base * (fleet.lemon_factor if n < fleet.lemons else 1.0) for n in range(total)]
    job = set(range(fleet.job_nodes))
    pool = deque(range(fleet.job_nodes, total))
    returns: list[tuple[float, int]] = []  # (time back, node) for nodes in repair
    scores: dict[int, deque[tuple[float, float]]] = {}
    retired: set[int] = set()
    out = Outcome()
    t, end = 0.0, fleet.days * DAY_S
    while True:
        t += rng.expovariate(sum(rate[n] for n in job))
        t = _return_repaired(returns, pool, t_now=t)
        if t >= end:
            break
        culprit = rng.choices(sorted(job), weights=[rate[n] for n in sorted(job)])[0]
        certain = rng.random() < fleet.hardware_share
        blamed = culprit
        if not certain and rng.random() >= fleet.uncertain_hit:
            blamed = rng.choice(sorted(job - {culprit}))
        out.interruptions += 1
        out.lost_s += fleet.cost_s
        job.discard(blamed)
        if policy.enabled and _score(scores, blamed, t, certain, policy) >= policy.threshold:
            retired.add(blamed)
            scores.pop(blamed)
            rate[blamed] = base  # the deep repair cures it
            heapq.heappush(returns, (t + fleet.deep_repair_s, blamed))
        else:
            heapq.heappush(returns, (t + fleet.repair_s, blamed))
        if not pool:  # no spare: the job waits for the first repaired node
            wait_until = returns[0][0]
            out.wait_s += wait_until - t
            out.lost_s += wait_until - t
            t = _return_repaired(returns, pool, t_now=wait_until)
        job.add(pool.popleft())
    out.retired = sorted(retired)
    return out


def _score(
    scores: dict[int, deque[tuple[float, float]]],
    node: int,
    t: float,
    certain: bool,
    policy: LemonPolicy,
) -> float:
    history = scores.setdefault(node, deque())
    history.append((t, HIGH_CONFIDENCE if certain else LOW_CONFIDENCE))
    while history and history[0][0] < t - policy.window_s:
        history.popleft()
    return lemon_score(history, t, policy)


def _return_repaired(returns: list[tuple[float, int]], pool: deque[int], t_now: float) -> float:
    """Nodes whose repair ended by `t_now` go back to the spare pool."""
    while returns and returns[0][0] <= t_now:
        pool.append(heapq.heappop(returns)[1])
    return t_now


@dataclass(frozen=True)
class Comparison:
    lost_h_without: float
    lost_h_with: float
    interruptions_without: float
    interruptions_with: float
    retired_lemons: float  # mean per run, with scoring
    retired_innocent: float
    runs: int


def compare(fleet: LemonFleet, policy: LemonPolicy, seeds: list[int]) -> Comparison:
    """The same failures (seeds) with and without lemon scoring."""
    off = [replay(fleet, LemonPolicy(enabled=False), s) for s in seeds]
    on = [replay(fleet, policy, s) for s in seeds]
    return Comparison(
        lost_h_without=statistics.mean(o.lost_s for o in off) / 3600,
        lost_h_with=statistics.mean(o.lost_s for o in on) / 3600,
        interruptions_without=statistics.mean(o.interruptions for o in off),
        interruptions_with=statistics.mean(o.interruptions for o in on),
        retired_lemons=statistics.mean(o.retired_lemons(fleet.lemons) for o in on),
        retired_innocent=statistics.mean(o.retired_innocent(fleet.lemons) for o in on),
        runs=len(seeds),
    )
