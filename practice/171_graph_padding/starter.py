"""Exercise 171: the batch sizes captured as CUDA graphs, and the padding of a decode batch."""

from __future__ import annotations


def graph_batch_sizes(max_bs: int) -> list[int]:
    """The captured sizes, ascending: 1, 2, 4 (those <= max_bs), then every multiple of 8 up
    to and including max_bs."""
    raise NotImplementedError


def padded_size(sizes: list[int], batch_size: int) -> int | None:
    """The smallest size in the ascending list `sizes` that is >= batch_size; None when no size
    is large enough."""
    raise NotImplementedError
