"""The fused MoE for a few tokens (a decode step): three launches, no sorting.

With T tokens of top-k there are at most T*k experts in use, and reading each of their weight
bytes once is the whole cost. Sorting and padding would add three launches for that, so after
the routing (one program for up to 16 tokens) ``_decode_gate_up_kernel`` runs one program per
(pair, column block): the first pair of each expert does that expert's work for every token
that chose it (at most T, one row each) and later pairs of the same expert return at once, so
only the chosen experts' weights are read, each once, and no program is launched for an expert
nobody chose. ``_decode_down_kernel`` runs one program per (token, column block), loads the
token's k experts' weights together and sums their outputs, so nothing is left to add up.

A decode step's three kernels are short (about ten microseconds each), so the gap between two
of them counts. With programmatic dependent launch (PDL, Hopper and later) a kernel is launched
while the one before it still runs: its programs get their place on the GPU early and wait in
``gdc_wait`` until the earlier kernel has finished and its writes are visible, then go. The
earlier kernel says when that may happen with ``gdc_launch_dependents``.
"""

from __future__ import annotations

from typing import Dict

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .moe_routing import route

MIN_BLOCK_T = 16  # tl.dot's smallest M: a few tokens are padded to 16 rows


@triton.jit
def silu_gate_up(
    x_ptrs,
    gate_ptrs,
    up_offset,
    rows_ok,
    col_ok,
    hidden,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """silu(x @ gate) * (x @ up) for one [BLOCK_M, BLOCK_N] tile: x_ptrs [BLOCK_M, BLOCK_K] and
    gate_ptrs [BLOCK_K, BLOCK_N] point at K = 0, the up rows lie up_offset elements past the
    gate rows; two dots over the hidden dimension, one result. (The aligned path's kernel
    takes its weight blocks through a descriptor instead: kernel/fused_moe.py.)"""
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
def _decode_gate_up_kernel(
    ids_ptr,
    x_ptr,
    w1_ptr,
    h_ptr,
    num_tokens,
    inter,
    hidden,
    TOP_K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """h[t * k + j, n] = silu(x[t] @ gate[e, n]) * (x[t] @ up[e, n]) for the tokens t whose j-th
    choice is e, the expert of this program's pair, BLOCK_N columns n."""
    pair, pid_n = tl.program_id(0), tl.program_id(1)
    if PDL:
        gdc_wait()  # the routing's ids are written
        gdc_launch_dependents()  # the down kernel's programs may take their places now
    expert = tl.load(ids_ptr + pair)
    earlier = tl.arange(0, BLOCK_P)
    earlier_ids = tl.load(ids_ptr + earlier, mask=earlier < pair, other=-1)
    if tl.sum((earlier_ids == expert).to(tl.int32), axis=0) > 0:
        return  # an earlier pair's program does this expert's work
    tokens = tl.arange(0, BLOCK_T)
    token_ok = tokens < num_tokens
    choice = tl.full([BLOCK_T], -1, dtype=tl.int32)  # which of its k choices e is, per token
    for j in tl.static_range(TOP_K):
        chosen = tl.load(ids_ptr + tokens * TOP_K + j, mask=token_ok, other=-1)
        choice = tl.where(chosen == expert, j, choice)
    chose = choice >= 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    col_ok = offs_n[None, :] < inter
    x_ptrs = x_ptr + tokens[:, None] * hidden + offs_k[None, :]
    gate_ptrs = (
        w1_ptr
        + expert.to(tl.int64) * 2 * inter * hidden
        + offs_n[None, :] * hidden
        + offs_k[:, None]
    )
    h = silu_gate_up(
        x_ptrs, gate_ptrs, inter * hidden, chose, col_ok, hidden, BLOCK_T, BLOCK_N, BLOCK_K
    )
    h_ptrs = h_ptr + (tokens * TOP_K + choice)[:, None] * inter + offs_n[None, :]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=chose[:, None] & col_ok)


@triton.jit
def _decode_down_kernel(
    h_ptr,
    w2_ptr,
    out_ptr,
    weights_ptr,
    ids_ptr,
    hidden,
    inter,
    TOP_K: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[t, n] = sum over the token's k choices j of weight * h[t * k + j] @ w2[e_j, n], for
    BLOCK_N columns n. Each step loads a [k, BLOCK_N, BLOCK_K] block, all k experts' weights at
    once: k matrix-vector products in flight together keep more bytes on the way from memory
    than one after another, and each step's block is asked for a step ahead. With PDL the
    first block is asked for before waiting on the gate_up kernel: it comes while that
    kernel finishes."""
    token, pid_n = tl.program_id(0), tl.program_id(1)
    choices = tl.arange(0, BLOCK_J)
    choice_ok = choices < TOP_K
    pairs = token * TOP_K + choices
    # the routing's ids are safe to read before gdc_wait: with PDL this program starts only once
    # every gate_up program has passed its own gdc_wait, which waited for the routing
    experts = tl.load(ids_ptr + pairs, mask=choice_ok, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    col_ok = offs_n < hidden
    h_ptrs = h_ptr + pairs[:, None] * inter + offs_k[None, :]
    w_ptrs = (
        w2_ptr
        + experts[:, None, None] * hidden * inter
        + offs_n[None, :, None] * inter
        + offs_k[None, None, :]
    )
    rows_ok = choice_ok[:, None, None] & col_ok[None, :, None]
    w = tl.load(w_ptrs, mask=rows_ok & (offs_k < inter)[None, None, :], other=0.0)
    if PDL:
        gdc_wait()  # h is written; outside the loop, so no load of h is moved above it
    acc = tl.zeros([BLOCK_J, BLOCK_N], dtype=tl.float32)
    for k in range(0, inter, BLOCK_K):
        h = tl.load(h_ptrs, mask=choice_ok[:, None] & (offs_k < inter - k)[None, :], other=0.0)
        product = w.to(tl.float32) * h.to(tl.float32)[:, None, :]
        w_ptrs += BLOCK_K
        h_ptrs += BLOCK_K
        next_ok = (offs_k < inter - k - BLOCK_K)[None, None, :]  # none after the last step
        w = tl.load(w_ptrs, mask=rows_ok & next_ok, other=0.0)  # the next step's, in flight
        acc += tl.sum(product, axis=2)
    weights = tl.load(weights_ptr + pairs, mask=choice_ok, other=0.0)
    out = tl.sum(acc * weights[:, None], axis=0)
    tl.store(out_ptr + token * hidden + offs_n, out.to(out_ptr.dtype.element_ty), mask=col_ok)


def decode_moe(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    gating_output: torch.Tensor,
    topk: int,
    renormalize: bool,
    config: Dict[str, Dict[str, int]],
    pdl: bool | None = None,
) -> torch.Tensor:
    """The whole MoE layer for a few tokens in three launches; x [T, H] contiguous, T at most
    what moe/configs.py sends here. Returns [T, H]. pdl: launch each kernel before the one it
    waits for has ended (the default on a GPU; the interpreter has no such launch)."""
    num_tokens, hidden = x.shape
    inter = w2.shape[2]
    pdl = x.is_cuda if pdl is None else pdl
    weights, ids, _ = route(gating_output, topk, renormalize, count=False, pdl=pdl)
    h = x.new_empty(num_tokens * topk, inter)
    gate_up, down = config["gate_up"], config["down"]
    _decode_gate_up_kernel[(num_tokens * topk, triton.cdiv(inter, gate_up["BLOCK_N"]))](
        ids,
        x,
        w1,
        h,
        num_tokens,
        inter,
        hidden,
        TOP_K=topk,
        BLOCK_T=max(MIN_BLOCK_T, triton.next_power_of_2(num_tokens)),
        BLOCK_P=triton.next_power_of_2(num_tokens * topk),
        BLOCK_N=gate_up["BLOCK_N"],
        BLOCK_K=gate_up["BLOCK_K"],
        PDL=pdl,
        num_warps=gate_up["num_warps"],
        num_stages=gate_up["num_stages"],
        launch_pdl=pdl,
    )
    out = x.new_empty(num_tokens, hidden)
    _decode_down_kernel[(num_tokens, triton.cdiv(hidden, down["BLOCK_N"]))](
        h,
        w2,
        out,
        weights,
        ids,
        hidden,
        inter,
        TOP_K=topk,
        BLOCK_J=triton.next_power_of_2(topk),
        BLOCK_N=down["BLOCK_N"],
        BLOCK_K=down["BLOCK_K"],
        PDL=pdl,
        num_warps=down["num_warps"],
        num_stages=down["num_stages"],
        launch_pdl=pdl,
    )
    return out
