"""Breaks: return new lists; do not change x or weight."""

from __future__ import annotations

import math


def rms_norm(x: list[list[float]], weight: list[float], eps: float) -> list[list[float]]:
    """Each row divided by sqrt(mean of its squares + eps), times weight (element by element)."""
    out = []
    for row in x:
        scale = 1.0 / math.sqrt(sum(v * v for v in row) / len(row) + eps)
        row[:] = [v * scale * w for v, w in zip(row, weight)]
        out.append(row)
    return out
