"""Routing and alignment for the fused MoE, on the GPU and without a host sync.

Four launches: ``_route_and_count_kernel`` (softmax, top-k and renormalization per token, and
how many of a block of tokens' pairs go to each expert), ``_sum_chunks_kernel`` (those counts
added up PLAN_CHUNK_B blocks at a time), ``_plan_tiles_kernel`` (each expert's run of tiles,
where each block's pairs start in it, the padding; its programs share the blocks and the tiles)
and ``_scatter_pairs_kernel`` (each pair to its place). Every output is sized for the worst case,
so the layer can be captured in a graph."""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

ROUTE_BLOCK_T = 16  # tokens per program of the routing and the scatter
# The launch sizes below, chosen with benchmark/sweep_moe_launches.py on an H200: first or
# second of each sweep at 4,096 and 16,384 tokens.
ROUTE_TOKENS_PER_WARP = 4  # the routing's warps: its block's tokens / this
PLAN_CHUNK_B = 32  # blocks per chunk of the plan, and chunks it reads per step
PLAN_TILE_CHUNK = 64  # tiles whose expert one program of the plan writes
PLAN_WARPS = SCATTER_WARPS = 2


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
def _route_rows(
    logits_ptr,
    tokens,
    experts,
    num_tokens,
    num_experts,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The rows ``tokens`` of the logits [T, E]: each row's k largest softmax values and their
    experts, [rows, BLOCK_K] (renormalized to sum to 1 if asked), and the probabilities with the
    chosen ones struck out (-1), as are the entries past the last token or expert."""
    valid = (tokens < num_tokens)[:, None] & (experts[None, :] < num_experts)
    logits = tl.load(
        logits_ptr + tokens[:, None] * num_experts + experts[None, :], mask=valid, other=0.0
    ).to(tl.float32)
    logits = tl.where(experts[None, :] < num_experts, logits, -float("inf"))  # rows past T: 0s
    probs = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = tl.where(valid, probs / tl.sum(probs, axis=1)[:, None], -1.0)
    slots = tl.arange(0, BLOCK_K)[None, :]
    weights = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best, best_id, probs = _take_largest(probs, experts, BLOCK_E)
        weights = tl.where(slots == j, best[:, None], weights)
        ids = tl.where(slots == j, best_id[:, None], ids)
    if RENORMALIZE:  # norm_topk_prob: the k weights sum to 1
        weights = weights / tl.sum(weights, axis=1)[:, None]
    return weights, ids, probs


@triton.jit
def _route_and_count_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    block_counts_ptr,
    num_tokens,
    num_experts,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    COUNT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """Tokens [pid * BLOCK_T, +BLOCK_T): their top-k experts and weights, and (if COUNT) the
    block's count of pairs per expert in block_counts[pid, :]: the struck-out probabilities."""
    pid = tl.program_id(0)
    if PDL:
        gdc_launch_dependents()  # the next kernel waits for our writes in its gdc_wait
    tokens = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.arange(0, BLOCK_E)
    weights, ids, probs = _route_rows(
        logits_ptr,
        tokens,
        experts,
        num_tokens,
        num_experts,
        TOP_K,
        RENORMALIZE,
        BLOCK_T,
        BLOCK_E,
        BLOCK_K,
    )
    slots = tl.arange(0, BLOCK_K)
    out = tokens[:, None] * TOP_K + slots[None, :]
    mine = (tokens < num_tokens)[:, None] & (slots < TOP_K)[None, :]
    tl.store(weights_ptr + out, weights, mask=mine)
    tl.store(ids_ptr + out, ids, mask=mine)
    if COUNT:
        chosen = (probs == -1.0) & (tokens < num_tokens)[:, None] & (experts < num_experts)[None, :]
        tl.store(block_counts_ptr + pid * BLOCK_E + experts, tl.sum(chosen.to(tl.int32), axis=0))


@triton.jit
def _sum_chunks_kernel(
    block_counts_ptr, chunk_counts_ptr, num_blocks, BLOCK_E: tl.constexpr, CHUNK_B: tl.constexpr
):
    """chunk_counts[c, :]: the pairs per expert of the blocks [c * CHUNK_B, +CHUNK_B), one
    load and one sum per program."""
    chunk = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    blocks = chunk * CHUNK_B + tl.arange(0, CHUNK_B)
    rows = tl.load(
        block_counts_ptr + blocks[:, None] * BLOCK_E + experts[None, :],
        mask=(blocks < num_blocks)[:, None],
        other=0,
    )
    tl.store(chunk_counts_ptr + chunk * BLOCK_E + experts, tl.sum(rows, axis=0))


@triton.jit
def _plan_tiles_kernel(
    block_counts_ptr,
    chunk_counts_ptr,
    block_offsets_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_blocks,
    num_chunks,
    num_pairs,
    tiles_capacity,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    CHUNK_B: tl.constexpr,
    TILE_CHUNK: tl.constexpr,
):
    """Each expert's pairs take a run of whole tiles, in expert order. Every program works
    the runs out from the chunks' counts (a load of CHUNK_B chunks a step: one step up to
    CHUNK_B² blocks, 16,384 tokens with the sizes above), then does its own share: program p
    the offsets of chunk p's blocks (each block's pairs of expert e start at e's run, plus the
    pairs of e in earlier blocks) and the experts of tiles [p * TILE_CHUNK, +TILE_CHUNK);
    program 0 also the padding and the size."""
    p = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    lanes = tl.arange(0, CHUNK_B)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    before = tl.zeros([BLOCK_E], dtype=tl.int32)  # pairs of each expert in chunks before p
    for c in range(0, num_chunks, CHUNK_B):
        chunks = c + lanes
        rows = tl.load(
            chunk_counts_ptr + chunks[:, None] * BLOCK_E + experts[None, :],
            mask=(chunks < num_chunks)[:, None],
            other=0,
        )
        counts += tl.sum(rows, axis=0)
        before += tl.sum(tl.where((chunks < p)[:, None], rows, 0), axis=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_end = tl.cumsum(tiles, axis=0)
    tile_start = tile_end - tiles
    total_tiles = tl.sum(tiles, axis=0)
    if p < num_chunks:  # chunk p's blocks: where each block's pairs of each expert begin
        blocks = p * CHUNK_B + lanes
        offsets = blocks[:, None] * BLOCK_E + experts[None, :]
        in_range = (blocks < num_blocks)[:, None]
        rows = tl.load(block_counts_ptr + offsets, mask=in_range, other=0)
        start = tile_start * BLOCK_M + before
        tl.store(
            block_offsets_ptr + offsets,
            start[None, :] + tl.cumsum(rows, axis=0) - rows,
            mask=in_range,
        )
    t = p * TILE_CHUNK + tl.arange(0, TILE_CHUNK)  # these tiles' experts; -1 past the last
    owner = tl.sum((tile_end[None, :] <= t[:, None]).to(tl.int32), axis=1)
    tl.store(expert_ids_ptr + t, tl.where(t < total_tiles, owner, -1), mask=t < tiles_capacity)
    if p == 0:  # the slots after each expert's pairs, to its last tile's end, hold num_pairs
        tl.store(num_padded_ptr, total_tiles * BLOCK_M)
        pad_pos = (tile_start * BLOCK_M + counts)[:, None] + tl.arange(0, BLOCK_M)[None, :]
        tl.store(sorted_ids_ptr + pad_pos, num_pairs, mask=pad_pos < (tile_end * BLOCK_M)[:, None])


@triton.jit
def _scatter_pairs_kernel(
    ids_ptr,
    block_offsets_ptr,
    sorted_ids_ptr,
    num_pairs,
    TOP_K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_P: tl.constexpr,
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


def route(
    gating_output: torch.Tensor, topk: int, renormalize: bool, count: bool = True, pdl: bool = False
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Top-k of the softmax of the router's logits [T, E], in one launch: weights [T, k] fp32,
    expert ids [T, k] int32, and (if count) each block of ROUTE_BLOCK_T tokens' pair count per
    expert, which the alignment needs and the decode path does not. Without counts a few tokens
    take a block their size: one token's routing is then one warp's, with no rows to waste.
    pdl: let the next kernel start before this one ends (kernel/moe_decode.py)."""
    num_tokens, num_experts = gating_output.shape
    block_t = ROUTE_BLOCK_T if count else min(ROUTE_BLOCK_T, triton.next_power_of_2(num_tokens))
    block_e = triton.next_power_of_2(num_experts)
    num_blocks = triton.cdiv(num_tokens, block_t)
    device = gating_output.device
    weights = torch.empty(num_tokens, topk, dtype=torch.float32, device=device)
    ids = torch.empty(num_tokens, topk, dtype=torch.int32, device=device)
    block_counts = (
        torch.empty(num_blocks, block_e, dtype=torch.int32, device=device) if count else None
    )
    _route_and_count_kernel[(num_blocks,)](
        gating_output.contiguous(),
        weights,
        ids,
        block_counts,
        num_tokens,
        num_experts,
        TOP_K=topk,
        RENORMALIZE=renormalize,
        COUNT=count,
        BLOCK_T=block_t,
        BLOCK_E=block_e,
        BLOCK_K=triton.next_power_of_2(topk),
        PDL=pdl,
        num_warps=max(1, block_t // ROUTE_TOKENS_PER_WARP),
    )
    return weights, ids, block_counts


def align(
    topk_ids: torch.Tensor, block_counts: torch.Tensor, num_experts: int, block_m: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs sorted by expert, each expert's run padded to whole tiles of block_m, in three
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
    num_chunks = triton.cdiv(num_blocks, PLAN_CHUNK_B)
    chunk_counts = torch.empty(num_chunks, block_e, dtype=torch.int32, device=device)
    _sum_chunks_kernel[(num_chunks,)](
        block_counts, chunk_counts, num_blocks, BLOCK_E=block_e, CHUNK_B=PLAN_CHUNK_B
    )
    programs = max(num_chunks, triton.cdiv(capacity, PLAN_TILE_CHUNK))
    _plan_tiles_kernel[(programs,)](
        block_counts,
        chunk_counts,
        block_offsets,
        sorted_ids,
        expert_ids,
        num_padded,
        num_blocks,
        num_chunks,
        num_pairs,
        capacity,
        BLOCK_M=block_m,
        BLOCK_E=block_e,
        CHUNK_B=PLAN_CHUNK_B,
        TILE_CHUNK=PLAN_TILE_CHUNK,
        num_warps=PLAN_WARPS,
    )
    _scatter_pairs_kernel[(num_blocks,)](
        topk_ids,
        block_offsets,
        sorted_ids,
        num_pairs,
        TOP_K=topk,
        BLOCK_T=ROUTE_BLOCK_T,
        BLOCK_E=block_e,
        BLOCK_P=triton.next_power_of_2(ROUTE_BLOCK_T * topk),
        num_warps=SCATTER_WARPS,
    )
    return sorted_ids, expert_ids, num_padded
