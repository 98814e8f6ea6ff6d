"""How each part of a repair grows with the number of ranks, and how many spares a fleet needs.

Pure formulas; `repairs.py` applies them to the projection's inputs.

- process start: each node starts its ranks in a time of its own (interpreter, framework import,
  model build); the gang waits for the slowest of its nodes. A node's start is modelled as the
  measured start plus an exponential excess of mean `tail` x start, so the slowest of n nodes
  takes start x (1 + tail x H(n)), H(n) the n-th harmonic number (~ ln n + 0.577): the expected
  maximum of n exponentials.
- communicator setup: grows linearly with the ranks it joins (NCCL's bootstrap gathers every
  rank's address through one ring).
- checkpoint read: each rank's bytes at its own bandwidth, capped by the shared tier's
  aggregate bandwidth for all the bytes read at once.
- a replica missing: keeping the global batch, the survivors take over its microbatches; a step
  waits for the survivor with the most, ceil(R x m / (R - k)) microbatches instead of m with k of
  R replicas out. Shrinking the batch instead, the job runs at (R - k) / R.
"""

from __future__ import annotations

import math

EULER_GAMMA = 0.5772156649015329


def harmonic(n: int) -> float:
    """H(n) = 1 + 1/2 + ... + 1/n (summed up to 64 terms, then its asymptotic expansion)."""
    if n <= 64:
        return math.fsum(1 / i for i in range(1, n + 1))
    return math.log(n) + EULER_GAMMA + 1 / (2 * n) - 1 / (12 * n * n)


def slowest_start_s(start_s: float, nodes: int, tail: float) -> float:
    """Expected start of the slowest of `nodes` nodes, each `start_s` plus an exponential excess
    of mean `tail` x `start_s`."""
    return start_s * (1 + tail * harmonic(nodes))


def comm_growth_s(ranks: int, s_per_krank: float) -> float:
    """Seconds a communicator's setup adds for `ranks` ranks, at `s_per_krank` per 1,000."""
    return s_per_krank * ranks / 1000


def read_s(bytes_per_rank: float, ranks: int, rank_gbps: float, aggregate_tbps: float) -> float:
    """Seconds for `ranks` ranks each to read `bytes_per_rank` from the shared tier at once."""
    own = bytes_per_rank / (rank_gbps * 1e9)
    shared = bytes_per_rank * ranks / (aggregate_tbps * 1e12)
    return max(own, shared)


def transfer_s(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9)


def throughput(replicas: int, missing: int, microbatches: int, keep_batch: bool) -> float:
    """The job's useful rate (1 at full width) with `missing` of `replicas` replicas out."""
    if missing <= 0:
        return 1.0
    if missing >= replicas:
        return 0.0
    left = replicas - missing
    if not keep_batch:
        return left / replicas
    most = -(-(replicas * microbatches) // left)  # ceil, in integers
    return microbatches / most


def poisson_quantile(mean: float, q: float) -> int:
    """The smallest k with P(X <= k) >= q for X ~ Poisson(mean)."""
    if mean <= 0:
        return 0
    k, term = 0, math.exp(-mean)
    total = term
    while total < q:
        k += 1
        term *= mean / k
        total += term
    return k


# Sentinel's spare rule: the pool runs dry at most 0.1% of the time, and holds at least one node.
SPARE_QUANTILE = 0.999
SPARE_FLOOR = 1
SPARE_RULE = (
    f"the {100 * SPARE_QUANTILE:g}th percentile of the nodes in repair at once (Poisson: node "
    f"swap-outs an hour x the repair's hours), at least {SPARE_FLOOR}"
)


def spares_for(swap_outs_per_s: float, repair_s: float) -> int:
    """Spares enough that every one is in repair at once with probability at most 0.1%: the
    nodes in repair at any time are Poisson with mean (swap-outs per second) x (repair seconds)
    (an M/G/infinity queue: every swapped-out node is repaired on its own)."""
    return max(SPARE_FLOOR, poisson_quantile(swap_outs_per_s * repair_s, SPARE_QUANTILE))
