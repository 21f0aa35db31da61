"""Breaks: return a new list; x is left unchanged."""

from __future__ import annotations

import math


def apply_rotary(x: list[float], position: int, inv_freq: list[float]) -> list[float]:
    """x rotated pair by pair (dim i with dim i + D/2) by position * inv_freq[i]."""
    half = len(inv_freq)
    first, second = [], []
    for i, freq in enumerate(inv_freq):
        c, s = math.cos(position * freq), math.sin(position * freq)
        a, b = x[i], x[i + half]
        first.append(a * c - b * s)
        second.append(b * c + a * s)
    x[:] = first + second
    return x
