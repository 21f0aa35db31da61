"""Breaks: in the neox layout dim i pairs with i + D/2, not i + 1."""

from __future__ import annotations

import math


def apply_rotary(x: list[float], position: int, inv_freq: list[float]) -> list[float]:
    """x rotated pair by pair (dim i with dim i + D/2) by position * inv_freq[i]."""
    first, second = [], []
    for i, freq in enumerate(inv_freq):
        c, s = math.cos(position * freq), math.sin(position * freq)
        a, b = x[2 * i], x[2 * i + 1]
        first.append(a * c - b * s)
        second.append(b * c + a * s)
    return first + second
