"""Breaks: sort the values (do not change the input list)."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between the two nearest ranks."""
    values.sort()
    ordered = values
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
