"""Breaks: the q-th percentile sits at rank r = (n - 1) * q / 100."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between the two nearest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = min(len(ordered) * q / 100, len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
