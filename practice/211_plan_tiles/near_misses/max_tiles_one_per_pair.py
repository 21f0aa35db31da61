"""Breaks: max_tiles is the exact worst case, not just enough."""

from __future__ import annotations


def max_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The tiles of block_m slots that aligning num_pairs pairs over num_experts experts can need,
    whatever the routing: at most n = min(experts, pairs) experts get pairs, one with c pairs
    needs 1 + (c - 1) // block_m tiles, and those add up to at most n + (pairs - n) // block_m
    (one pair on each expert but one, the rest on that one)."""
    return num_pairs


def plan_tiles(
    block_counts: list[list[int]], block_m: int
) -> tuple[list[list[int]], list[int], int]:
    """From each block's pair count per expert alone: (block_offsets, where block b's first pair
    of expert e goes; expert_ids, each tile's expert, -1 past the used tiles, max_tiles long;
    num_padded, the used slots)."""
    num_experts = len(block_counts[0])
    counts = [sum(block[e] for block in block_counts) for e in range(num_experts)]
    tiles = [-(-count // block_m) for count in counts]  # an expert with no pair: no tile
    tile_start = [sum(tiles[:e]) for e in range(num_experts)]
    running = [start * block_m for start in tile_start]
    block_offsets = []
    for block in block_counts:  # the earlier blocks' pairs of e come first
        block_offsets.append(list(running))
        running = [r + c for r, c in zip(running, block)]
    capacity = max_tiles(sum(counts), num_experts, block_m)
    expert_ids = [e for e in range(num_experts) for _ in range(tiles[e])]
    expert_ids += [-1] * (capacity - len(expert_ids))
    return block_offsets, expert_ids, sum(tiles) * block_m


def align(
    topk_ids: list[list[int]], num_experts: int, block_m: int, block_t: int
) -> tuple[list[int], list[int], int]:
    """The pairs t * k + j sorted by expert, in pair order within an expert, each expert's run
    padded to whole tiles with the sentinel T * k, in buffers of max_tiles tiles: (sorted_ids,
    expert_ids, num_padded), by the kernels' three steps over blocks of block_t tokens."""
    flat = [e for row in topk_ids for e in row]
    pairs_per_block = block_t * len(topk_ids[0])
    blocks = [flat[i : i + pairs_per_block] for i in range(0, len(flat), pairs_per_block)]
    block_counts = [[block.count(e) for e in range(num_experts)] for block in blocks]
    block_offsets, expert_ids, num_padded = plan_tiles(block_counts, block_m)
    sorted_ids = [len(flat)] * (len(expert_ids) * block_m)
    for b, block in enumerate(blocks):  # each block on its own, as the scatter's programs
        next_slot = list(block_offsets[b])
        for i, expert in enumerate(block):
            sorted_ids[next_slot[expert]] = b * pairs_per_block + i
            next_slot[expert] += 1
    return sorted_ids, expert_ids, num_padded
