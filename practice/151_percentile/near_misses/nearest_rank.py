"""Breaks: linear interpolation between the two nearest ranks."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between the two nearest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank + 0.5)
    high = low
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
