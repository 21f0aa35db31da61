"""Breaks: the smallest size that holds batch_size rows (>= batch_size)."""

from __future__ import annotations


def graph_batch_sizes(max_bs: int) -> list[int]:
    """The captured sizes, ascending: 1, 2, 4 (those <= max_bs), then every multiple of 8 up
    to and including max_bs."""
    return [bs for bs in (1, 2, 4) if bs <= max_bs] + list(range(8, max_bs + 1, 8))


def padded_size(sizes: list[int], batch_size: int) -> int | None:
    """The smallest size in the ascending list `sizes` that is >= batch_size; None when no size
    is large enough."""
    return next((bs for bs in sizes if bs > batch_size), None)
