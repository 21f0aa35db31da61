from __future__ import annotations


def apply_rotary(x: list[float], position: int, inv_freq: list[float]) -> list[float]:
    """x rotated pair by pair (dim i with dim i + D/2) by position * inv_freq[i]."""
    raise NotImplementedError
