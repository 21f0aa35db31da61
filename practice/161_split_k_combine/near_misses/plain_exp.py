"""Breaks: compute it without overflow (an lse may be 1000)."""

from __future__ import annotations

import math


def _div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def split_ranges(seq_len: int, num_splits: int, block_n: int) -> list[tuple[int, int]]:
    """The non-empty [start, end) key ranges of the splits, each an equal whole-block share."""
    split_len = _div_ceil(_div_ceil(seq_len, num_splits), block_n) * block_n
    starts = [s * split_len for s in range(num_splits)]
    return [(start, min(start + split_len, seq_len)) for start in starts if start < seq_len]


def combine_splits(parts: list[tuple[list[float], float]]) -> list[float]:
    """Merge the splits' (normalized output, log-sum-exp) into the output over all keys."""
    m, total = -math.inf, 0.0
    acc = [0.0] * len(parts[0][0])
    for out, lse in parts:  # one split at a time, with a running maximum
        m_new = 0.0
        alpha, weight = math.exp(m - m_new), math.exp(lse - m_new)
        acc = [a * alpha + o * weight for a, o in zip(acc, out)]
        total = total * alpha + weight
        m = m_new
    return [a / total for a in acc]
