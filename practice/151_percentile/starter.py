from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between the two nearest ranks."""
    raise NotImplementedError
