"""Breaks: the mean is over the row's entries (divide by the row length)."""

from __future__ import annotations

import math


def rms_norm(x: list[list[float]], weight: list[float], eps: float) -> list[list[float]]:
    """Each row divided by sqrt(mean of its squares + eps), times weight (element by element)."""
    out = []
    for row in x:
        scale = 1.0 / math.sqrt(sum(v * v for v in row) + eps)
        out.append([v * scale * w for v, w in zip(row, weight)])
    return out
