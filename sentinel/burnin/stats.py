"""Robust statistics shared by the judges: medians and the median absolute deviation."""

from __future__ import annotations

from collections.abc import Sequence

MAD_SCALE = 1.4826  # MAD * this estimates the standard deviation of normal data


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        raise ValueError("median of nothing")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def upper_median(xs: Sequence[float]) -> float:
    """The median, taking the higher middle value: one bad peer cannot drag a pair down."""
    s = sorted(xs)
    return s[len(s) // 2]


def mad(xs: Sequence[float]) -> float:
    m = median(xs)
    return MAD_SCALE * median([abs(x - m) for x in xs])


def variance(value: float, baseline: float) -> float:
    """SuperBench's relative change against a saved healthy figure."""
    return (value - baseline) / baseline
