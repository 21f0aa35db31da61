"""The fused MoE for a few tokens (a decode step): three launches, no sorting.

With T tokens of top-k there are at most T*k experts in use, and reading each of their weight
bytes once is the whole cost. Sorting and padding would add two launches for that, so after
the routing (one program for up to 16 tokens) ``_decode_gate_up_kernel`` runs one program per
(expert, column block): it keeps the tokens that chose its expert (at most T, one row each) and
returns at once if none did, so only the chosen experts' weights are read, each once.
``_decode_down_kernel`` runs one program per (token, column block) and sums the token's k
expert outputs as it goes, so nothing is left to add up afterwards.
"""

from __future__ import annotations

from typing import Dict

import torch
import triton
import triton.language as tl

from .fused_moe import silu_gate_up
from .moe_routing import route

MIN_BLOCK_T = 16  # tl.dot's smallest M: a few tokens are padded to 16 rows


@triton.jit
def _decode_gate_up_kernel(
    ids_ptr, x_ptr, w1_ptr, h_ptr, num_tokens, inter, hidden,
    TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """h[t * k + j, n] = silu(x[t] @ gate[e, n]) * (x[t] @ up[e, n]) for the tokens t whose j-th
    choice is this program's expert e, BLOCK_N columns n."""
    expert, pid_n = tl.program_id(0), tl.program_id(1)
    tokens = tl.arange(0, BLOCK_T)
    token_ok = tokens < num_tokens
    choice = tl.full([BLOCK_T], -1, dtype=tl.int32)  # which of its k choices e is, per token
    for j in tl.static_range(TOP_K):
        chosen = tl.load(ids_ptr + tokens * TOP_K + j, mask=token_ok, other=-1)
        choice = tl.where(chosen == expert, j, choice)
    chose = choice >= 0
    if tl.sum(chose.to(tl.int32), axis=0) == 0:
        return  # no token chose this expert: its weights are not read
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    col_ok = offs_n[None, :] < inter
    x_ptrs = x_ptr + tokens[:, None] * hidden + offs_k[None, :]
    gate_ptrs = w1_ptr + expert.to(tl.int64) * 2 * inter * hidden + offs_n[None, :] * hidden \
        + offs_k[:, None]
    h = silu_gate_up(x_ptrs, gate_ptrs, inter * hidden, chose, col_ok, hidden,
                     BLOCK_T, BLOCK_N, BLOCK_K)
    h_ptrs = h_ptr + (tokens * TOP_K + choice)[:, None] * inter + offs_n[None, :]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=chose[:, None] & col_ok)


@triton.jit
def _decode_down_kernel(
    h_ptr, w2_ptr, out_ptr, weights_ptr, ids_ptr, hidden,
    INTER: tl.constexpr, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[t, n] = sum over the token's k choices of weight * h[t * k + j] @ w2[e_j, n]: a
    matrix-vector product per choice, BLOCK_N output columns. Both loops are unrolled (INTER is
    known when compiling), which on the H200 neither sped it up nor slowed it down."""
    token, pid_n = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    col_ok = offs_n < hidden
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = token * TOP_K + j
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        part = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k in tl.static_range(0, INTER, BLOCK_K):
            k_ok = offs_k < INTER - k
            h = tl.load(h_ptr + pair * INTER + k + offs_k, mask=k_ok, other=0.0)
            w = tl.load(w2_ptr + expert * hidden * INTER + offs_n[:, None] * INTER + k
                        + offs_k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            part += tl.sum(w.to(tl.float32) * h.to(tl.float32)[None, :], axis=1)
        acc += tl.load(weights_ptr + pair) * part
    tl.store(out_ptr + token * hidden + offs_n, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def decode_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, gating_output: torch.Tensor,
               topk: int, renormalize: bool, config: Dict[str, Dict[str, int]]) -> torch.Tensor:
    """The whole MoE layer for a few tokens in three launches; x [T, H] contiguous, T at most
    what moe/configs.py sends here. Returns [T, H]."""
    num_tokens, hidden = x.shape
    num_experts, inter = w1.shape[0], w2.shape[2]
    weights, ids, _ = route(gating_output, topk, renormalize)
    h = x.new_empty(num_tokens * topk, inter)
    gate_up, down = config["gate_up"], config["down"]
    _decode_gate_up_kernel[(num_experts, triton.cdiv(inter, gate_up["BLOCK_N"]))](
        ids, x, w1, h, num_tokens, inter, hidden, TOP_K=topk,
        BLOCK_T=max(MIN_BLOCK_T, triton.next_power_of_2(num_tokens)),
        BLOCK_N=gate_up["BLOCK_N"], BLOCK_K=gate_up["BLOCK_K"], num_warps=gate_up["num_warps"],
        num_stages=gate_up["num_stages"])
    out = x.new_empty(num_tokens, hidden)
    _decode_down_kernel[(num_tokens, triton.cdiv(hidden, down["BLOCK_N"]))](
        h, w2, out, weights, ids, hidden, INTER=inter, TOP_K=topk, BLOCK_N=down["BLOCK_N"],
        BLOCK_K=down["BLOCK_K"], num_warps=down["num_warps"], num_stages=down["num_stages"])
    return out
