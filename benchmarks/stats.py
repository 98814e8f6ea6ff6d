"""The statistics every benchmark reports, computed one way: percentiles by nearest rank.

Benchmarks run as scripts (`python benchmarks/X.py`), so they import this as `stats`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The sample at quantile `q` (0..1) by nearest rank: an observed value, never one
    interpolated between two (a p99 is a latency some request had)."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def percentile_ms(samples: Sequence[float], q: float) -> float | None:
    """`percentile` of samples in seconds, in milliseconds to 2 decimals; None with none."""
    return round(percentile(samples, q) * 1000, 2) if samples else None


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)
