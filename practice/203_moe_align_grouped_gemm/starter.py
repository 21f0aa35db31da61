"""Exercise 203: sort the (token, expert) pairs by expert in tiles, then one GEMM over the tiles."""

from __future__ import annotations


def moe_align_block_size(
    topk_ids: list[list[int]], block_m: int, num_experts: int
) -> tuple[list[int], list[int], int]:
    """The pair indices t * k + j grouped by expert (ascending), each group in pair order and
    padded with the placeholder T * k to a multiple of block_m; one expert id per tile of
    block_m entries; and the padded count."""
    raise NotImplementedError


def grouped_gemm(
    x: list[list[float]],
    w: list[list[list[float]]],
    weights: list[list[float]],
    sorted_ids: list[int],
    expert_ids: list[int],
    block_m: int,
    top_k: int,
) -> list[list[float]]:
    """out[t] = sum over the pairs (t, j) of weights[t][j] * (w[e] @ x[t]), where e is the expert
    of the tile that holds pair t * top_k + j; placeholders (>= T * top_k) are skipped."""
    raise NotImplementedError
