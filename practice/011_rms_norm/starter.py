from __future__ import annotations


def rms_norm(x: list[list[float]], weight: list[float], eps: float) -> list[list[float]]:
    """Each row divided by sqrt(mean of its squares + eps), times weight (element by element)."""
    raise NotImplementedError
