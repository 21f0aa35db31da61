"""Paged attention in Triton: decode (split-K, flash-decoding style) and extend (prefill).

Both read every key through the page table: ``page_table[row, pos]`` is the KV slot of the
request's token at position ``pos``, so any page size works and pages may lie anywhere in the pool.
Scores are kept in base 2 (scaled by log2(e)) because exp2 is the GPU's native exponential.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)

# Tile sizes and launch options, for 16-bit inputs and for float32 (exact dots, no tensor cores).
# Checked free of register spills on sm_90 with ptxas (float32 extend spills a little, and only
# serves the identity tests); benchmark/bench_attention.py --sweep times the alternatives.
DECODE_TILES = {
    "16bit": dict(BLOCK_N=32, num_warps=4, num_stages=2),
    "float32": dict(BLOCK_N=32, num_warps=8, num_stages=2),
}
EXTEND_TILES = {
    "16bit": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    "float32": dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=1),
}


@triton.jit
def _attend_block(
    q,
    m_i,
    l_i,
    acc,
    k_head,
    v_head,
    slots,
    key_mask,
    visible,
    qk_scale,
    stride_k_slot,
    stride_v_slot,
    offs_d,
    mask_d,
    PRECISION: tl.constexpr,
):
    """Fold one block of keys into the running (online) softmax of a block of queries.

    q: [M, BLOCK_D]; m_i, l_i: [M] running max (base 2) and sum of exponentials; acc: [M, BLOCK_D]
    the unnormalised output; slots: [N] the keys' KV slots; key_mask: [N] which keys exist;
    visible: [M, N] which query sees which key. k_head, v_head point at the KV head in slot 0.
    """
    k = tl.load(
        k_head + slots[None, :] * stride_k_slot + offs_d[:, None],
        mask=key_mask[None, :] & mask_d[:, None],
        other=0.0,
    )  # [BLOCK_D, N]
    scores = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # [M, N]
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
    p = tl.exp2(scores - m_new[:, None])
    v = tl.load(
        v_head + slots[:, None] * stride_v_slot + offs_d[None, :],
        mask=key_mask[:, None] & mask_d[None, :],
        other=0.0,
    )  # [N, BLOCK_D]
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _split_len(seq_len, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys per split: an even share of seq_len, rounded up to whole blocks (the last may be
    short, the ones after it empty). Both decode stages must agree on it."""
    return tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N


# Decode, stage 1. One program: request b, KV head g, split s. The GROUP query heads that share KV
# head g (padded to BLOCK_H >= 16 rows so that tl.dot runs on tensor cores) attend over the keys at
# positions [s * split_len, (s + 1) * split_len) of request b, each key loaded once for all of them.
# It writes their normalised partial outputs to mid_o[b, heads, s] and log-sum-exps (base 2) to
# mid_lse[b, heads, s]; an empty split writes nothing, and stage 2 skips it.
@triton.jit
def _decode_split_kernel(
    q,
    k_cache,
    v_cache,
    page_table,
    rows,
    seq_lens,
    mid_o,
    mid_lse,
    qk_scale,
    stride_q_req,
    stride_q_head,
    stride_k_slot,
    stride_k_head,
    stride_v_slot,
    stride_v_head,
    stride_pt_row,
    stride_mo_req,
    stride_mo_head,
    stride_mo_split,
    stride_ml_req,
    stride_ml_head,
    head_dim,
    GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(seq_lens + b)
    split_len = _split_len(seq_len, NUM_SPLITS, BLOCK_N)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    if start >= end:
        return
    table = page_table + tl.load(rows + b).to(tl.int64) * stride_pt_row
    heads = kv_head * GROUP + tl.arange(0, BLOCK_H)
    mask_h = tl.arange(0, BLOCK_H) < GROUP  # the padding rows compute on zeros and are dropped
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    mask_hd = mask_h[:, None] & mask_d[None, :]
    q_blk = tl.load(
        q + b * stride_q_req + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=mask_hd,
        other=0.0,
    )
    k_head, v_head = k_cache + kv_head * stride_k_head, v_cache + kv_head * stride_v_head
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n in range(start, end, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        key_mask = offs_n < end
        slots = tl.load(table + offs_n, mask=key_mask, other=0).to(tl.int64)
        m_i, l_i, acc = _attend_block(
            q_blk,
            m_i,
            l_i,
            acc,
            k_head,
            v_head,
            slots,
            key_mask,
            key_mask[None, :],
            qk_scale,
            stride_k_slot,
            stride_v_slot,
            offs_d,
            mask_d,
            PRECISION,
        )
    mid = b * stride_mo_req + heads * stride_mo_head + split * stride_mo_split
    tl.store(mid_o + mid[:, None] + offs_d[None, :], acc / l_i[:, None], mask=mask_hd)
    lse = b * stride_ml_req + heads * stride_ml_head + split
    tl.store(mid_lse + lse, m_i + tl.log2(l_i), mask=mask_h)


# Decode, stage 2. One program: request b, query head h. It merges the non-empty splits' partial
# outputs, each weighted by exp2(its lse - the largest lse), into o[b, h].
@triton.jit
def _decode_combine_kernel(
    mid_o,
    mid_lse,
    o,
    seq_lens,
    stride_mo_req,
    stride_mo_head,
    stride_mo_split,
    stride_ml_req,
    stride_ml_head,
    stride_o_req,
    stride_o_head,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b, h = tl.program_id(0), tl.program_id(1)
    seq_len = tl.load(seq_lens + b)
    split_len = _split_len(seq_len, NUM_SPLITS, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for split in range(NUM_SPLITS):
        if split * split_len < seq_len:  # the same test as stage 1's: skip empty splits
            lse = tl.load(mid_lse + b * stride_ml_req + h * stride_ml_head + split)
            part = tl.load(
                mid_o + b * stride_mo_req + h * stride_mo_head + split * stride_mo_split + offs_d,
                mask=mask_d,
                other=0.0,
            )
            m_new = tl.maximum(m, lse)
            alpha, weight = tl.exp2(m - m_new), tl.exp2(lse - m_new)
            acc = acc * alpha + part * weight
            total = total * alpha + weight
            m = m_new
    out = acc / total
    tl.store(
        o + b * stride_o_req + h * stride_o_head + offs_d, out.to(o.dtype.element_ty), mask=mask_d
    )


def _precision(dtype: torch.dtype) -> str:
    # Exact float32 dots for the identity tests; the flag does nothing to 16-bit inputs.
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_rows_contiguous(*tensors: torch.Tensor) -> None:
    # The kernels step along the head dimension by 1; every other dimension goes by its stride.
    assert all(x.stride(-1) == 1 for x in tensors), "the head dimension must be contiguous"


def _tiles(table: dict, dtype: torch.dtype) -> dict:
    return table["float32" if dtype == torch.float32 else "16bit"]


def default_num_kv_splits(batch: int, num_kv_heads: int) -> int:
    """Splits enough for about 1024 stage-1 programs (an H200 has 132 SMs), 2 to 32 of them:
    few requests need many splits to keep every SM reading, many requests need few."""
    wanted = triton.cdiv(1024, batch * num_kv_heads)
    return min(32, max(2, triton.next_power_of_2(wanted)))


def head_block(head_dim: int) -> int:
    """The kernels' block over the head dimension: a power of two, and at least 16, since every
    side of a tl.dot must be (a compiled kernel refuses less; the interpreter does not check).
    The loads and stores are masked to head_dim, so the padding reads and writes nothing."""
    return max(16, triton.next_power_of_2(head_dim))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    num_kv_splits: int | None = None,
) -> torch.Tensor:
    """Each request's one new token attends over all its tokens; its K and V are already stored.

    q: [B, Hq, D]; k_cache, v_cache: [num_slots, Hkv, D]; page_table: [rows, width] int32;
    rows: [B] the page-table row of each request; seq_lens: [B] int32, >= 1, tokens to attend
    (the new one included); num_kv_splits: by default from B -> [B, Hq, D]. No host sync, and
    every shape depends only on B and the arguments, so the call can be captured in a CUDA graph.
    """
    batch, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    num_kv_splits = num_kv_splits or default_num_kv_splits(batch, num_kv_heads)
    _check_rows_contiguous(q, k_cache, v_cache)
    group = num_qo_heads // num_kv_heads
    block_h = max(16, triton.next_power_of_2(group))  # tl.dot wants at least 16 rows
    block_d = head_block(head_dim)
    tiles = _tiles(DECODE_TILES, q.dtype)
    mid_o = q.new_empty((batch, num_qo_heads, num_kv_splits, head_dim), dtype=torch.float32)
    mid_lse = q.new_empty((batch, num_qo_heads, num_kv_splits), dtype=torch.float32)
    o = q.new_empty(q.shape)
    _decode_split_kernel[(batch, num_kv_heads, num_kv_splits)](
        q,
        k_cache,
        v_cache,
        page_table,
        rows,
        seq_lens,
        mid_o,
        mid_lse,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        page_table.stride(0),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        head_dim,
        GROUP=group,
        NUM_SPLITS=num_kv_splits,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        PRECISION=_precision(q.dtype),
        **tiles,
    )
    _decode_combine_kernel[(batch, num_qo_heads)](
        mid_o,
        mid_lse,
        o,
        seq_lens,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        o.stride(0),
        o.stride(1),
        head_dim,
        NUM_SPLITS=num_kv_splits,
        BLOCK_N=tiles["BLOCK_N"],
        BLOCK_D=block_d,
    )
    return o


# Extend. One program: request b, query head h, and a block of BLOCK_M of the request's new tokens
# (queries i .. i + BLOCK_M - 1, at positions cached_len + i ...). Part 1 attends over the cached
# prefix, positions 0 .. cached_len - 1, which every new token sees; part 2 over the new tokens up
# to the block's last one, with the causal mask. Both read the keys through the page table.
@triton.jit
def _extend_kernel(
    q,
    k_cache,
    v_cache,
    o,
    page_table,
    rows,
    cached_lens,
    extend_lens,
    q_starts,
    qk_scale,
    stride_q_tok,
    stride_q_head,
    stride_k_slot,
    stride_k_head,
    stride_v_slot,
    stride_v_head,
    stride_o_tok,
    stride_o_head,
    stride_pt_row,
    head_dim,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b, h = tl.program_id(0), tl.program_id(1)
    block = tl.num_programs(2) - 1 - tl.program_id(2)  # the longest blocks first: a short tail
    extend_len = tl.load(extend_lens + b)
    if block * BLOCK_M >= extend_len:  # the grid is sized for the longest request
        return
    cached_len = tl.load(cached_lens + b)
    table = page_table + tl.load(rows + b).to(tl.int64) * stride_pt_row
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the request
    mask_m = offs_m < extend_len
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    q_rows = tl.load(q_starts + b) + offs_m
    q_blk = tl.load(
        q + q_rows[:, None] * stride_q_tok + h * stride_q_head + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )
    kv_head = h // GROUP
    k_head, v_head = k_cache + kv_head * stride_k_head, v_cache + kv_head * stride_v_head
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n in range(0, cached_len, BLOCK_N):  # part 1: the prefix, all visible
        offs_n = n + tl.arange(0, BLOCK_N)
        key_mask = offs_n < cached_len
        slots = tl.load(table + offs_n, mask=key_mask, other=0).to(tl.int64)
        m_i, l_i, acc = _attend_block(
            q_blk,
            m_i,
            l_i,
            acc,
            k_head,
            v_head,
            slots,
            key_mask,
            key_mask[None, :],
            qk_scale,
            stride_k_slot,
            stride_v_slot,
            offs_d,
            mask_d,
            PRECISION,
        )
    causal_end = tl.minimum((block + 1) * BLOCK_M, extend_len)  # later keys are all masked
    for n in range(0, causal_end, BLOCK_N):  # part 2: the new tokens, key j seen by queries >= j
        offs_n = n + tl.arange(0, BLOCK_N)
        key_mask = offs_n < causal_end
        slots = tl.load(table + cached_len + offs_n, mask=key_mask, other=0).to(tl.int64)
        visible = key_mask[None, :] & (offs_n[None, :] <= offs_m[:, None])
        m_i, l_i, acc = _attend_block(
            q_blk,
            m_i,
            l_i,
            acc,
            k_head,
            v_head,
            slots,
            key_mask,
            visible,
            qk_scale,
            stride_k_slot,
            stride_v_slot,
            offs_d,
            mask_d,
            PRECISION,
        )
    out = acc / l_i[:, None]
    tl.store(
        o + q_rows[:, None] * stride_o_tok + h * stride_o_head + offs_d[None, :],
        out.to(o.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    cached_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    q_starts: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
) -> torch.Tensor:
    """The batch's new tokens attend over their requests' cached prefixes and, causally, each other.

    q: [T, Hq, D], request after request, request b's extend_lens[b] tokens from row q_starts[b];
    their K and V are already stored. k_cache, v_cache: [num_slots, Hkv, D]; page_table: [rows,
    width] int32; rows, cached_lens, extend_lens, q_starts: [B]; max_extend_len: a host int, the
    largest extend_len, that sizes the grid -> [T, Hq, D].
    """
    num_tokens, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    _check_rows_contiguous(q, k_cache, v_cache)
    tiles = _tiles(EXTEND_TILES, q.dtype)
    o = q.new_empty(q.shape)  # contiguous, whatever q's strides
    grid = (rows.shape[0], num_qo_heads, triton.cdiv(max_extend_len, tiles["BLOCK_M"]))
    if num_tokens == 0 or max_extend_len == 0:
        return o
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        o,
        page_table,
        rows,
        cached_lens,
        extend_lens,
        q_starts,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        o.stride(0),
        o.stride(1),
        page_table.stride(0),
        head_dim,
        GROUP=num_qo_heads // num_kv_heads,
        BLOCK_D=head_block(head_dim),
        PRECISION=_precision(q.dtype),
        **tiles,
    )
    return o
