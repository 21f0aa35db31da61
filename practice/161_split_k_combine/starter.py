from __future__ import annotations


def split_ranges(seq_len: int, num_splits: int, block_n: int) -> list[tuple[int, int]]:
    """The non-empty [start, end) key ranges of the splits, each an equal whole-block share."""
    raise NotImplementedError


def combine_splits(parts: list[tuple[list[float], float]]) -> list[float]:
    """Merge the splits' (normalized output, log-sum-exp) into the output over all keys."""
    raise NotImplementedError
