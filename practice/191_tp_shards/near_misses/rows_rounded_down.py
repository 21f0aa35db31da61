"""Breaks: every rank holds rows = ceil(num_embeddings / size) rows."""

from __future__ import annotations


def vocab_range(num_embeddings: int, rank: int, size: int) -> tuple[int, int, int]:
    """Rank `rank`'s rows of the vocabulary: (start, end, rows); every rank holds rows =
    ceil(num_embeddings / size) rows, the tail past `end` being zero padding."""
    rows = max(num_embeddings // size, 1)
    start = min(rank * rows, num_embeddings)
    return start, min(start + rows, num_embeddings), rows


def _even(n: int, size: int) -> int:
    if n % size:
        raise ValueError(f"{n} is not evenly divisible by {size}")
    return n // size


def shard(matrix: list[list[float]], kind: str, rank: int, size: int) -> list[list[float]]:
    """Rank `rank`'s part of a weight [out][in] as its layer holds it: "column" (column-parallel)
    its share of the rows, "row" (row-parallel) its share of the columns, "vocab" its rows of
    the vocabulary padded with zero rows, "whole" a copy of all of it."""
    if kind == "vocab":
        start, end, rows = vocab_range(len(matrix), rank, size)
        width = len(matrix[0]) if matrix else 0
        padding = [[0.0] * width for _ in range(rows - (end - start))]
        return [list(r) for r in matrix[start:end]] + padding
    if kind == "column":
        part = _even(len(matrix), size)
        return [list(r) for r in matrix[rank * part : (rank + 1) * part]]
    if kind == "row":
        part = _even(len(matrix[0]) if matrix else 0, size)
        return [list(r[rank * part : (rank + 1) * part]) for r in matrix]
    if kind == "whole":
        return [list(r) for r in matrix]
    raise ValueError(f"unknown kind {kind!r}")
