"""Fused MoE: the (token, expert) pairs sorted by expert and padded to the block size, then two
Triton GEMMs that each cover every expert in one launch."""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from minisgl.layers.activation import silu_and_mul

from .base import BaseMoeBackend, select_experts

BLOCK_N, BLOCK_K = 32, 32  # fixed tile sizes (upstream chooses them by shape)


def moe_align_block_size(topk_ids: torch.Tensor, block_m: int,
                         num_experts: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sort the (token, expert) pairs by expert and pad each expert's run to a multiple of block_m.

    Returns sorted_ids (indices into topk_ids.flatten(), with num_pairs as the padding value) and
    each tile's expert id.
    """
    flat = topk_ids.flatten().long()
    num_pairs = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    seg_start = torch.cumsum(padded, 0) - padded  # where each expert's run starts in the output
    order = torch.argsort(flat, stable=True)  # the pair indices after sorting by expert
    sorted_expert = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[sorted_expert]
    sorted_ids = torch.full((int(padded.sum()),), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_ids[seg_start[sorted_expert] + rank] = order.to(torch.int32)
    expert_ids = torch.repeat_interleave(torch.arange(num_experts, device=flat.device),
                                         padded // block_m).to(torch.int32)
    return sorted_ids, expert_ids


@triton.jit
def fused_moe_kernel(
    a_ptr, b_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
    N, K, num_valid_tokens,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr, TOP_K: tl.constexpr,
):
    """C[t, :] = A[t // TOP_K, :] @ B[expert].T (optionally times the routing weight); t indexes the sorted (token, expert) pairs."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // num_pid_n, pid % num_pid_n
    offs_token = tl.load(sorted_token_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    token_mask = offs_token < num_valid_tokens  # the padding placeholders take no part in the computation
    expert = tl.load(expert_ids_ptr + pid_m)  # which expert this tile belongs to
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_token[:, None] // TOP_K) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remain = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_remain), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_remain) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if MUL_ROUTED_WEIGHT:
        w = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = c_ptr + offs_token[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=token_mask[:, None] & (offs_n[None, :] < N))


def _invoke(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, topk_weights: torch.Tensor,
            sorted_ids: torch.Tensor, expert_ids: torch.Tensor, mul_routed_weight: bool,
            top_k: int, num_valid_tokens: int, block_m: int) -> None:
    """One launch of fused_moe_kernel: c[t] = a[t // top_k] @ b[expert of t].T for every pair t.

    a: [rows, K]; b: [E, N, K]; c: [num_pairs, N]; one program per (tile of block_m pairs,
    BLOCK_N output columns).
    """
    num_tiles, n = expert_ids.numel(), b.shape[1]
    if num_tiles == 0:  # no tokens: nothing to launch
        return
    grid = (num_tiles * triton.cdiv(n, BLOCK_N),)
    fused_moe_kernel[grid](
        a, b, c, topk_weights, sorted_ids, expert_ids,
        n, b.shape[2], num_valid_tokens,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), c.stride(0), c.stride(1),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        MUL_ROUTED_WEIGHT=mul_routed_weight, TOP_K=top_k,
    )


class FusedMoeBackend(BaseMoeBackend):
    """Every expert in two Triton launches (gate_up, then down) over the pairs sorted by expert."""

    def __init__(self, block_m: int = 16):
        self.block_m = block_m  # pairs per tile; each expert's run is padded to a multiple of it

    def forward(self, hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                gating_output: torch.Tensor, topk: int, renormalize: bool) -> torch.Tensor:
        num_tokens, hidden = hidden_states.shape
        topk_weights, topk_ids = select_experts(gating_output, topk, renormalize)
        num_pairs = topk_ids.numel()
        sorted_ids, expert_ids = moe_align_block_size(topk_ids, self.block_m, w1.shape[0])
        weights = topk_weights.flatten().to(hidden_states.dtype).contiguous()
        cache1 = hidden_states.new_empty(num_pairs, w1.shape[1])  # [T*k, 2I]
        _invoke(hidden_states, w1, cache1, weights, sorted_ids, expert_ids, False, topk,
                num_pairs, self.block_m)
        cache2 = silu_and_mul(cache1)  # [T*k, I]
        cache3 = hidden_states.new_empty(num_pairs, hidden)  # [T*k, H], already times the routing weight
        _invoke(cache2, w2, cache3, weights, sorted_ids, expert_ids, True, 1,
                num_pairs, self.block_m)
        return cache3.view(num_tokens, topk, hidden).sum(dim=1)
