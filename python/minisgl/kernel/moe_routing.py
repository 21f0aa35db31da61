"""Routing and alignment for the fused MoE, on the GPU and without a host sync.

Three launches: ``_route_and_count_kernel`` (softmax, top-k and renormalization per token, and
how many of a block of tokens' pairs go to each expert), ``_plan_tiles_kernel`` (one program:
each expert's run of tiles, where each block's pairs start in it, the padding) and
``_scatter_pairs_kernel`` (each pair to its place). Every output is sized for the worst case,
so the layer can be captured in a graph.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

ROUTE_BLOCK_T = 16  # tokens per program of the routing and the scatter


def max_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Tiles of block_m pairs that alignment can need, whatever the routing. At most n =
    min(experts, pairs) experts get pairs; one with c pairs needs 1 + (c - 1) // block_m tiles,
    and those add up to at most n + (num_pairs - n) // block_m, which some routing reaches."""
    used = min(num_experts, num_pairs)
    return max(used + (num_pairs - used) // block_m, 1)


@triton.jit
def _take_largest(probs, experts, BLOCK_E: tl.constexpr):
    """Each row's largest value and its column (the lowest on an exact tie), and the rows with
    that column struck out."""
    best = tl.max(probs, axis=1)
    best_id = tl.min(tl.where(probs == best[:, None], experts[None, :], BLOCK_E), axis=1)
    return best, best_id, tl.where(experts[None, :] == best_id[:, None], -1.0, probs)


@triton.jit
def _routing_probs(logits_ptr, tokens, experts, num_tokens, num_experts,
                   TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_E: tl.constexpr):
    """The softmax of the rows ``tokens`` of the logits [T, E], scaled so that each row's k
    largest are its routing weights; negative past the last expert (never chosen). Rows past
    the last token hold nothing meaningful: the callers mask them."""
    token_ok = tokens < num_tokens
    valid = token_ok[:, None] & (experts[None, :] < num_experts)
    logits = tl.load(logits_ptr + tokens[:, None] * num_experts + experts[None, :], mask=valid,
                     other=0.0).to(tl.float32)
    logits = tl.where(experts[None, :] < num_experts, logits, -float("inf"))  # rows past T: 0s
    probs = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = tl.where(valid, probs / tl.sum(probs, axis=1)[:, None], -1.0)
    if RENORMALIZE:  # a first pass for the sum of the k largest (norm_topk_prob)
        chosen_sum = tl.zeros([BLOCK_T], dtype=tl.float32)
        rest = probs
        for _ in tl.static_range(TOP_K):
            best, _, rest = _take_largest(rest, experts, BLOCK_E)
            chosen_sum += best
        probs = probs / chosen_sum[:, None]  # a positive scale: the order is the same
    return probs


@triton.jit
def _route_and_count_kernel(
    logits_ptr, weights_ptr, ids_ptr, block_counts_ptr, num_tokens, num_experts,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """Tokens [pid * BLOCK_T, +BLOCK_T): their top-k experts and weights, and the block's count
    of pairs per expert in block_counts[pid, :]."""
    pid = tl.program_id(0)
    tokens = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.arange(0, BLOCK_E)
    token_ok = tokens < num_tokens
    probs = _routing_probs(logits_ptr, tokens, experts, num_tokens, num_experts,
                           TOP_K, RENORMALIZE, BLOCK_T, BLOCK_E)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for k in tl.static_range(TOP_K):
        best, best_id, probs = _take_largest(probs, experts, BLOCK_E)
        tl.store(weights_ptr + tokens * TOP_K + k, best, mask=token_ok)
        tl.store(ids_ptr + tokens * TOP_K + k, best_id, mask=token_ok)
        hit = (experts[None, :] == best_id[:, None]) & token_ok[:, None]
        counts += tl.sum(hit.to(tl.int32), axis=0)
    tl.store(block_counts_ptr + pid * BLOCK_E + experts, counts)


@triton.jit
def _plan_tiles_kernel(
    block_counts_ptr, block_offsets_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_blocks, num_pairs, tiles_capacity,
    BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, TILE_CHUNK: tl.constexpr,
):
    """One program. Each expert's pairs take a run of whole tiles, in expert order; each block
    of tokens' pairs of expert e start at that run's start plus the earlier blocks' pairs of e."""
    experts = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for b in range(num_blocks):
        counts += tl.load(block_counts_ptr + b * BLOCK_E + experts)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_end = tl.cumsum(tiles, axis=0)
    tile_start = tile_end - tiles
    total_tiles = tl.sum(tiles, axis=0)
    tl.store(num_padded_ptr, total_tiles * BLOCK_M)
    running = tile_start * BLOCK_M
    for b in range(num_blocks):  # where block b's pairs of each expert begin
        tl.store(block_offsets_ptr + b * BLOCK_E + experts, running)
        running += tl.load(block_counts_ptr + b * BLOCK_E + experts)
    # the slots after each expert's pairs, up to its last tile's end, hold the sentinel num_pairs
    lanes = tl.arange(0, BLOCK_M)
    pad_pos = running[:, None] + lanes[None, :]
    tl.store(sorted_ids_ptr + pad_pos, num_pairs, mask=pad_pos < (tile_end * BLOCK_M)[:, None])
    for t0 in range(0, tiles_capacity, TILE_CHUNK):  # each tile's expert; -1 past the last
        t = t0 + tl.arange(0, TILE_CHUNK)
        owner = tl.sum((tile_end[None, :] <= t[:, None]).to(tl.int32), axis=1)
        tl.store(expert_ids_ptr + t, tl.where(t < total_tiles, owner, -1), mask=t < tiles_capacity)


@triton.jit
def _scatter_pairs_kernel(
    ids_ptr, block_offsets_ptr, sorted_ids_ptr, num_pairs,
    TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Pair p of block pid goes to its expert's start for this block plus the number of the
    block's earlier pairs with the same expert: the order of pairs is kept within an expert."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK_P)  # BLOCK_T * TOP_K pairs, rounded up to a power of 2
    pairs = pid * BLOCK_T * TOP_K + lanes
    mine = (lanes < BLOCK_T * TOP_K) & (pairs < num_pairs)
    ids = tl.load(ids_ptr + pairs, mask=mine, other=-1)
    experts = tl.arange(0, BLOCK_E)
    onehot = (ids[:, None] == experts[None, :]).to(tl.int32)  # [pairs of the block, experts]
    earlier = tl.cumsum(onehot, axis=0) - onehot
    start = tl.load(block_offsets_ptr + pid * BLOCK_E + experts)
    pos = tl.sum(onehot * (start[None, :] + earlier), axis=1)
    tl.store(sorted_ids_ptr + pos, pairs, mask=mine)


def route(gating_output: torch.Tensor, topk: int, renormalize: bool,
          ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k of the softmax of the router's logits [T, E], in one launch: weights [T, k] fp32,
    expert ids [T, k] int32, and each block of ROUTE_BLOCK_T tokens' pair count per expert."""
    num_tokens, num_experts = gating_output.shape
    block_e = triton.next_power_of_2(num_experts)
    num_blocks = triton.cdiv(num_tokens, ROUTE_BLOCK_T)
    device = gating_output.device
    weights = torch.empty(num_tokens, topk, dtype=torch.float32, device=device)
    ids = torch.empty(num_tokens, topk, dtype=torch.int32, device=device)
    block_counts = torch.empty(num_blocks, block_e, dtype=torch.int32, device=device)
    _route_and_count_kernel[(num_blocks,)](
        gating_output.contiguous(), weights, ids, block_counts, num_tokens, num_experts,
        TOP_K=topk, RENORMALIZE=renormalize, BLOCK_T=ROUTE_BLOCK_T, BLOCK_E=block_e)
    return weights, ids, block_counts


def align(topk_ids: torch.Tensor, block_counts: torch.Tensor, num_experts: int,
          block_m: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs sorted by expert, each expert's run padded to whole tiles of block_m, in two
    launches: sorted_ids [tiles * block_m] (pair indices; num_pairs in the padding), expert_ids
    [tiles] (-1 past the last used tile) and num_padded [1], the used slots."""
    num_pairs, topk = topk_ids.numel(), topk_ids.shape[-1]
    num_blocks, block_e = block_counts.shape
    capacity = max_tiles(num_pairs, num_experts, block_m)
    device = topk_ids.device
    sorted_ids = torch.empty(capacity * block_m, dtype=torch.int32, device=device)
    expert_ids = torch.empty(capacity, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    block_offsets = torch.empty_like(block_counts)
    _plan_tiles_kernel[(1,)](
        block_counts, block_offsets, sorted_ids, expert_ids, num_padded, num_blocks, num_pairs,
        capacity, BLOCK_M=block_m, BLOCK_E=block_e, TILE_CHUNK=256)
    _scatter_pairs_kernel[(num_blocks,)](
        topk_ids, block_offsets, sorted_ids, num_pairs,
        TOP_K=topk, BLOCK_T=ROUTE_BLOCK_T, BLOCK_E=block_e,
        BLOCK_P=triton.next_power_of_2(ROUTE_BLOCK_T * topk))
    return sorted_ids, expert_ids, num_padded


def moe_align(topk_ids: torch.Tensor, num_experts: int,
              block_m: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``align`` for expert ids routed elsewhere ([T, k]): counts them first (a benchmark's
    baseline routes with torch and aligns here)."""
    topk_ids = topk_ids.to(torch.int32).contiguous()
    num_tokens, topk = topk_ids.shape
    block_e = triton.next_power_of_2(num_experts)
    blocks = triton.cdiv(num_tokens, ROUTE_BLOCK_T)
    padded = torch.full((blocks * ROUTE_BLOCK_T, topk), -1, dtype=torch.int32,
                        device=topk_ids.device)
    padded[:num_tokens] = topk_ids
    onehot = padded.view(blocks, -1, 1) == torch.arange(block_e, device=topk_ids.device)
    block_counts = onehot.sum(dim=1, dtype=torch.int32)
    return align(topk_ids, block_counts, num_experts, block_m)
