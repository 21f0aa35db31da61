"""Exercise 191: what one tensor-parallel rank holds of a weight and of the vocabulary."""

from __future__ import annotations


def vocab_range(num_embeddings: int, rank: int, size: int) -> tuple[int, int, int]:
    """Rank `rank`'s rows of the vocabulary: (start, end, rows); every rank holds rows =
    ceil(num_embeddings / size) rows, the tail past `end` being zero padding."""
    raise NotImplementedError


def shard(matrix: list[list[float]], kind: str, rank: int, size: int) -> list[list[float]]:
    """Rank `rank`'s part of a weight [out][in] as its layer holds it: "column" (column-parallel)
    its share of the rows, "row" (row-parallel) its share of the columns, "vocab" its rows of
    the vocabulary padded with zero rows, "whole" a copy of all of it."""
    raise NotImplementedError
