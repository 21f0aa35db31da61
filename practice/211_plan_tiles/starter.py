"""Exercise 211: sort the (token, expert) pairs into tiles by expert, in buffers of a fixed size."""

from __future__ import annotations


def max_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The tiles of block_m slots that aligning num_pairs pairs over num_experts experts can need,
    whatever the routing (never more than either bound of the statement)."""
    raise NotImplementedError


def plan_tiles(
    block_counts: list[list[int]], block_m: int
) -> tuple[list[list[int]], list[int], int]:
    """From each block's pair count per expert alone: (block_offsets, where block b's first pair
    of expert e goes; expert_ids, each tile's expert, -1 past the used tiles, max_tiles long;
    num_padded, the used slots)."""
    raise NotImplementedError


def align(
    topk_ids: list[list[int]], num_experts: int, block_m: int, block_t: int
) -> tuple[list[int], list[int], int]:
    """The pairs t * k + j sorted by expert, in pair order within an expert, each expert's run
    padded to whole tiles with the sentinel T * k, in buffers of max_tiles tiles: (sorted_ids,
    expert_ids, num_padded), by the kernels' three steps over blocks of block_t tokens."""
    raise NotImplementedError
