"""Breaks: skip placeholders."""

from __future__ import annotations


def moe_align_block_size(
    topk_ids: list[list[int]], block_m: int, num_experts: int
) -> tuple[list[int], list[int], int]:
    """The pair indices t * k + j grouped by expert (ascending), each group in pair order and
    padded with the placeholder T * k to a multiple of block_m; one expert id per tile of
    block_m entries; and the padded count."""
    flat = [e for row in topk_ids for e in row]
    placeholder = len(flat)
    sorted_ids: list[int] = []
    expert_ids: list[int] = []
    for expert in range(num_experts):
        run = [pair for pair, e in enumerate(flat) if e == expert]
        tiles = -(-len(run) // block_m)  # ceil: an expert with no pair gets no tile
        sorted_ids += run + [placeholder] * (tiles * block_m - len(run))
        expert_ids += [expert] * tiles
    return sorted_ids, expert_ids, len(sorted_ids)


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
    num_pairs = len(x) * top_k
    out = [[0.0] * (len(w[0]) if w else 0) for _ in x]
    for tile, expert in enumerate(expert_ids):
        for pair in sorted_ids[tile * block_m : (tile + 1) * block_m]:
            t, j = divmod(min(pair, num_pairs - 1), top_k)
            row = [sum(a * b for a, b in zip(w_row, x[t])) for w_row in w[expert]]
            out[t] = [o + weights[t][j] * r for o, r in zip(out[t], row)]
    return out
