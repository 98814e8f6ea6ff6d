"""Robust statistics shared by the judges (burn-in's, the agent's peer comparison): medians and
the median absolute deviation. Pure Python: a few numbers, many times a sweep."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MAD_SCALE = 1.4826  # MAD * this estimates the standard deviation of normal data


def median(xs: Iterable[float]) -> float:
    """The middle value (the mean of the two middle ones of an even count); ValueError when
    there is none."""
    s = sorted(xs)
    if not s:
        raise ValueError("median of nothing")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def upper_median(xs: Sequence[float]) -> float:
    """The median, taking the higher middle value: one bad peer cannot drag a pair down."""
    s = sorted(xs)
    return s[len(s) // 2]


def mad(xs: Sequence[float], scale: float) -> float:
    """The median absolute deviation from the median, times `scale`: `MAD_SCALE` to estimate a
    normal sample's standard deviation, 1.0 for the MAD itself."""
    m = median(xs)
    return scale * median([abs(x - m) for x in xs])


def variance(value: float, baseline: float) -> float:
    """SuperBench's relative change against a saved healthy figure."""
    return (value - baseline) / baseline
