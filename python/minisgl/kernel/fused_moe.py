"""The fused MoE's two grouped GEMMs over the pairs sorted by expert (kernel/moe_routing.py).

``gate_up_silu``: h[slot] = silu(x[t] @ gate[e].T) * (x[t] @ up[e].T) for the pair in each
sorted slot; the [pairs, 2I] product is never written. ``down``: y[pair] = weight * h[slot] @
w2[e].T. Both launch a grid for the worst case and let the programs past the used tiles return,
so no size is read on the host. Tile sizes come per call (moe/configs.py). With HALF_TAILS a
tile whose second half is all padding (an expert's last tile, at most half full) computes only
its first half: both kernels hold a path for each height. ``sum_choices`` adds up each token's
k rows of y.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
import triton
import triton.language as tl

SUM_BLOCK_T, SUM_BLOCK_H = 8, 256  # the k-sum's tile: 8 tokens by 256 columns


@triton.jit
def _tile_of(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Program pid's (tile row, tile column), GROUP_M rows at a time: programs that run together
    read the same few tile rows and, where an expert spans several tiles, the same weight
    columns, so more of their loads hit the L2 cache."""
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % in_group) % group_rows, (pid % in_group) // group_rows


@triton.jit
def silu_gate_up(x_ptrs, gate_ptrs, up_offset, rows_ok, col_ok, hidden,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """silu(x @ gate) * up for one [BLOCK_M, BLOCK_N] tile: x_ptrs [BLOCK_M, BLOCK_K] and
    gate_ptrs [BLOCK_K, BLOCK_N] point at K = 0, the up rows lie up_offset elements past the
    gate rows; two dots over the hidden dimension, one result."""
    offs_k = tl.arange(0, BLOCK_K)
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, hidden, BLOCK_K):
        k_ok = offs_k < hidden - k
        a = tl.load(x_ptrs, mask=rows_ok[:, None] & k_ok[None, :], other=0.0)
        w_ok = k_ok[:, None] & col_ok
        gate = tl.dot(a, tl.load(gate_ptrs, mask=w_ok, other=0.0), gate)
        up = tl.dot(a, tl.load(gate_ptrs + up_offset, mask=w_ok, other=0.0), up)
        x_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _gate_up_rows(x_ptr, w1_ptr, h_ptr, sorted_ids_ptr, first, expert, pid_n,
                  num_pairs, inter, hidden, stride_xm, stride_we, stride_wn, stride_hm,
                  TOP_K: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """h for the ROWS slots from ``first`` (all the expert's) and BLOCK_N columns."""
    slots = first + tl.arange(0, ROWS)
    pairs = tl.load(sorted_ids_ptr + slots)
    real = pairs < num_pairs  # padding slots compute zeros from masked loads
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (pairs // TOP_K)[:, None] * stride_xm + offs_k[None, :]
    gate_ptrs = w1_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]
    col_ok = offs_n[None, :] < inter
    h = silu_gate_up(x_ptrs, gate_ptrs, inter * stride_wn, real, col_ok, hidden,
                     ROWS, BLOCK_N, BLOCK_K)
    h_ptrs = h_ptr + slots[:, None] * stride_hm + offs_n[None, :]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _padding_half(sorted_ids_ptr, first, num_pairs, BLOCK_M: tl.constexpr,
                  HALF_TAILS: tl.constexpr):
    """Whether the tile's second half is all padding: an expert's last tile with at most
    BLOCK_M / 2 pairs (padding follows an expert's pairs, so its first slot tells)."""
    if HALF_TAILS:
        return tl.load(sorted_ids_ptr + first + BLOCK_M // 2) >= num_pairs
    return False


@triton.jit
def _gate_up_silu_kernel(
    x_ptr, w1_ptr, h_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_pairs, inter, hidden, num_pid_m,
    stride_xm, stride_we, stride_wn, stride_hm,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, HALF_TAILS: tl.constexpr,
):
    """h[slot, n] = silu(gate) * up for BLOCK_M sorted slots and BLOCK_N intermediate columns:
    the gate rows n and the up rows inter + n of the expert's w1, two products, one store.
    With HALF_TAILS a tile whose second half is padding computes only its first half."""
    pid_m, pid_n = _tile_of(tl.program_id(0), num_pid_m, tl.cdiv(inter, BLOCK_N), GROUP_M)
    first = pid_m * BLOCK_M
    if first >= tl.load(num_padded_ptr):
        return  # a tile the worst case needed and this routing did not
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if _padding_half(sorted_ids_ptr, first, num_pairs, BLOCK_M, HALF_TAILS):
        _gate_up_rows(x_ptr, w1_ptr, h_ptr, sorted_ids_ptr, first, expert, pid_n, num_pairs,
                      inter, hidden, stride_xm, stride_we, stride_wn, stride_hm,
                      TOP_K, BLOCK_M // 2, BLOCK_N, BLOCK_K)
    else:
        _gate_up_rows(x_ptr, w1_ptr, h_ptr, sorted_ids_ptr, first, expert, pid_n, num_pairs,
                      inter, hidden, stride_xm, stride_we, stride_wn, stride_hm,
                      TOP_K, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _down_rows(h_ptr, w2_ptr, y_ptr, weights_ptr, sorted_ids_ptr, first, expert, pid_n,
               num_pairs, hidden, inter, stride_hm, stride_we, stride_wn, stride_ym,
               ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y for the pairs of the ROWS slots from ``first`` and BLOCK_N columns."""
    slots = first + tl.arange(0, ROWS)
    pairs = tl.load(sorted_ids_ptr + slots)
    real = pairs < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    h_ptrs = h_ptr + slots[:, None] * stride_hm + offs_k[None, :]
    w_ptrs = w2_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]
    col_ok = offs_n[None, :] < hidden
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k in range(0, inter, BLOCK_K):
        k_ok = offs_k < inter - k
        a = tl.load(h_ptrs, mask=k_ok[None, :], other=0.0)
        acc = tl.dot(a, tl.load(w_ptrs, mask=k_ok[:, None] & col_ok, other=0.0), acc)
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    acc *= tl.load(weights_ptr + pairs, mask=real, other=0.0)[:, None]
    y_ptrs = y_ptr + pairs[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=real[:, None] & col_ok)


@triton.jit
def _down_kernel(
    h_ptr, w2_ptr, y_ptr, weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_pairs, hidden, inter, num_pid_m,
    stride_hm, stride_we, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    HALF_TAILS: tl.constexpr,
):
    """y[pair, n] = weight[pair] * h[slot] @ w2[expert, n]: h's rows are read in slot order
    (contiguous), the result goes back to the pair's own row. HALF_TAILS as above."""
    pid_m, pid_n = _tile_of(tl.program_id(0), num_pid_m, tl.cdiv(hidden, BLOCK_N), GROUP_M)
    first = pid_m * BLOCK_M
    if first >= tl.load(num_padded_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if _padding_half(sorted_ids_ptr, first, num_pairs, BLOCK_M, HALF_TAILS):
        _down_rows(h_ptr, w2_ptr, y_ptr, weights_ptr, sorted_ids_ptr, first, expert, pid_n,
                   num_pairs, hidden, inter, stride_hm, stride_we, stride_wn, stride_ym,
                   BLOCK_M // 2, BLOCK_N, BLOCK_K)
    else:
        _down_rows(h_ptr, w2_ptr, y_ptr, weights_ptr, sorted_ids_ptr, first, expert, pid_n,
                   num_pairs, hidden, inter, stride_hm, stride_we, stride_wn, stride_ym,
                   BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _sum_choices_kernel(y_ptr, out_ptr, num_tokens, hidden, TOP_K: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t, n] = sum over j of y[t * k + j, n] for BLOCK_T tokens and BLOCK_H columns: the
    k loads are independent, so all are in flight at once."""
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = (tokens < num_tokens)[:, None] & (cols < hidden)[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        rows = tokens * TOP_K + j
        acc += tl.load(y_ptr + rows[:, None] * hidden + cols[None, :], mask=ok).to(tl.float32)
    tl.store(out_ptr + tokens[:, None] * hidden + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=ok)


def _launch_options(config: Dict[str, int], sorted_ids: torch.Tensor,
                    expert_ids: torch.Tensor) -> Dict[str, Any]:
    """The kernel's tile sizes: BLOCK_M is the alignment's (slots per tile), the rest config's.
    HALF_TAILS (optional, off by default) needs BLOCK_M of 32 or more: a half is a dot's rows."""
    block_m = sorted_ids.numel() // expert_ids.numel()
    if config.get("HALF_TAILS", False) and block_m < 32:
        raise ValueError(f"HALF_TAILS needs BLOCK_M >= 32 (tl.dot's 16 rows a half); got {block_m}")
    return dict(BLOCK_M=block_m, BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
                GROUP_M=config["GROUP_M"], HALF_TAILS=config.get("HALF_TAILS", False),
                num_warps=config["num_warps"], num_stages=config["num_stages"])


def gate_up_silu(x: torch.Tensor, w1: torch.Tensor, h: torch.Tensor, sorted_ids: torch.Tensor,
                 expert_ids: torch.Tensor, num_padded: torch.Tensor, topk: int,
                 config: Dict[str, int]) -> None:
    """h [slots, I] = silu(x @ gate.T) * (x @ up.T), each slot's token and expert; x [T, H],
    w1 [E, 2I, H] (gate rows, then up rows); all contiguous. config: BLOCK_N, BLOCK_K, GROUP_M,
    num_warps, num_stages."""
    inter, num_pid_m = w1.shape[1] // 2, expert_ids.numel()
    grid = (num_pid_m * triton.cdiv(inter, config["BLOCK_N"]),)
    _gate_up_silu_kernel[grid](
        x, w1, h, sorted_ids, expert_ids, num_padded, x.shape[0] * topk, inter, x.shape[1],
        num_pid_m, x.stride(0), w1.stride(0), w1.stride(1), h.stride(0),
        TOP_K=topk, **_launch_options(config, sorted_ids, expert_ids))


def down(h: torch.Tensor, w2: torch.Tensor, y: torch.Tensor, weights: torch.Tensor,
         sorted_ids: torch.Tensor, expert_ids: torch.Tensor, num_padded: torch.Tensor,
         config: Dict[str, int]) -> None:
    """y [pairs, H] = weight * h[slot] @ w2[expert].T for every pair; h [slots, I], w2 [E, H, I],
    weights [pairs] fp32."""
    hidden, num_pid_m = w2.shape[1], expert_ids.numel()
    grid = (num_pid_m * triton.cdiv(hidden, config["BLOCK_N"]),)
    _down_kernel[grid](
        h, w2, y, weights, sorted_ids, expert_ids, num_padded, y.shape[0], hidden, w2.shape[2],
        num_pid_m, h.stride(0), w2.stride(0), w2.stride(1), y.stride(0),
        **_launch_options(config, sorted_ids, expert_ids))


def sum_choices(y: torch.Tensor, topk: int) -> torch.Tensor:
    """[T, H]: each token's k rows of y [T * k, H] (contiguous) added up, in fp32, in one pass
    over y (torch's sum over the middle dimension of [T, k, H] reads it more slowly)."""
    num_tokens, hidden = y.shape[0] // topk, y.shape[1]
    out = y.new_empty(num_tokens, hidden)
    grid = (triton.cdiv(num_tokens, SUM_BLOCK_T), triton.cdiv(hidden, SUM_BLOCK_H))
    _sum_choices_kernel[grid](y, out, num_tokens, hidden, TOP_K=topk, BLOCK_T=SUM_BLOCK_T,
                              BLOCK_H=SUM_BLOCK_H)
    return out
