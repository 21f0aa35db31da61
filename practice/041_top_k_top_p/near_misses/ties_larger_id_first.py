"""Breaks: ties are broken by the smaller token id first."""

from __future__ import annotations


def top_k_top_p_filter(
    probs: list[list[float]], top_k: list[int], top_p: list[float]
) -> list[list[float]]:
    """Each row with the tokens its top-k / top-p leaves out set to 0.0 (not renormalized)."""
    return [_filter_row(row, k, p) for row, k, p in zip(probs, top_k, top_p)]


def _filter_row(row: list[float], k: int, p: float) -> list[float]:
    order = sorted(range(len(row)), key=lambda t: (-row[t], -t))  # stable: smaller id first
    k = k if k > 0 else len(row)
    out = [0.0] * len(row)
    mass_before = 0.0
    for rank, token in enumerate(order):
        if rank >= k or (p < 1.0 and mass_before >= p):
            break  # every later token is left out too
        out[token] = row[token]
        mass_before += row[token]
    return out
