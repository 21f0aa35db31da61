"""The tuned fused MoE that production engines run, rebuilt as chapter 21's baseline.

vLLM and SGLang run an MoE layer's experts as one Triton grouped GEMM per projection, over the
(token, expert) pairs sorted by expert, and they tune it per device: a JSON file per expert shape
and GPU gives, for each batch size, the tile sizes (BLOCK_SIZE_M/N/K), GROUP_SIZE_M (how many
tile rows share one sweep over the weight columns, so their weight tiles stay in the L2),
num_warps and num_stages. This file rebuilds that approach from its description, with their
published H200 configs for E=128, N=768 (Qwen3-30B-A3B at TP=1) in
``results/moe_baseline_configs_h200.json``. A batch of T tokens takes the config whose key is
nearest to T, as theirs does.

Routing is torch's softmax, top-k and renormalization, as their ``fused_topk``; the alignment is
chapter 21's ``align`` on pair counts made here with torch (GPU kernels standing in for their
CUDA one, so that the benchmark compares GEMMs with GEMMs); then GEMM 1, ``silu_and_mul``,
GEMM 2 times the routing weight and a sum over the k experts. Nothing reads a value back to the
host: the grid covers the worst case of tiles and a program past the last padded tile returns at
once, so the layer can be captured in a CUDA graph.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import torch
import triton
import triton.language as tl

CONFIG_FILE = Path(__file__).resolve().parent / "results" / "moe_baseline_configs_h200.json"


def load_configs(path: Path = CONFIG_FILE) -> Dict[int, dict]:
    """Batch size -> {BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, ...}."""
    return {int(m): config for m, config in json.loads(path.read_text())["configs"].items()}


def nearest_config(configs: Dict[int, dict], num_tokens: int) -> dict:
    """The config tuned for the batch size nearest to num_tokens (the smaller one on a tie)."""
    return configs[min(sorted(configs), key=lambda m: abs(m - num_tokens))]


@triton.jit
def grouped_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    topk_weights_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    N,
    K,
    num_pairs,
    num_tiles,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    TOP_K: tl.constexpr,
):
    """C[p, :] = A[p // TOP_K, :] @ B[expert of p].T for the sorted pairs p of one tile.

    The programs go through the tiles GROUP_M tile rows at a time: within a group, consecutive
    programs take the next tile row and the same columns, so a group reads each weight tile
    once from memory and GROUP_M - 1 times from the L2.
    """
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_m = (pid // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_tiles - first_m, GROUP_M)  # the last group may be short
    pid_m = first_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):  # a tile past the last expert's run
        return
    offs_pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    pair_mask = offs_pair < num_pairs  # padding slots hold num_pairs and compute nothing
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_pair[:, None] // TOP_K) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=pair_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if MUL_ROUTED_WEIGHT:
        weight = tl.load(topk_weights_ptr + offs_pair, mask=pair_mask, other=0.0)
        acc = acc * weight[:, None]
    c_ptrs = c_ptr + offs_pair[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(
        c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=pair_mask[:, None] & (offs_n[None, :] < N)
    )


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    topk_weights: torch.Tensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    mul_routed_weight: bool,
    config: dict,
) -> None:
    """c[p] = a[p // top_k] @ b[expert of p].T (times p's routing weight if asked), every pair p.

    a: [rows, K]; b: [E, N, K]; c: [num_pairs, N]; topk_weights: [num_pairs] fp32. One program
    per (tile, BLOCK_SIZE_N columns) for every tile the alignment may fill, without reading
    how many it did fill.
    """
    num_tiles, (n, k) = expert_ids.numel(), b.shape[1:]
    grid = (num_tiles * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    grouped_gemm_kernel[grid](
        a,
        b,
        c,
        topk_weights,
        sorted_ids,
        expert_ids,
        num_padded,
        n,
        k,
        c.shape[0],
        num_tiles,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        c.stride(0),
        c.stride(1),
        BLOCK_M=config["BLOCK_SIZE_M"],
        BLOCK_N=config["BLOCK_SIZE_N"],
        BLOCK_K=config["BLOCK_SIZE_K"],
        GROUP_M=config["GROUP_SIZE_M"],
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        TOP_K=top_k,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )


def count_pairs(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Each block of ROUTE_BLOCK_T tokens' pairs per expert, [blocks, E rounded up to a power of
    2] int32: what chapter 21's ``align`` reads, counted with torch on the device (chapter 21's
    routing kernel counts them as it routes). topk_ids: [T, k] int32."""
    from minisgl.kernel.moe_routing import ROUTE_BLOCK_T

    num_tokens, topk = topk_ids.shape
    blocks = triton.cdiv(num_tokens, ROUTE_BLOCK_T)
    padded = topk_ids.new_full((blocks * ROUTE_BLOCK_T, topk), -1)
    padded[:num_tokens] = topk_ids
    experts = torch.arange(triton.next_power_of_2(num_experts), device=topk_ids.device)
    return (padded.view(blocks, -1, 1) == experts).sum(dim=1, dtype=torch.int32)


class TunedBaselineMoe:
    """An MoE layer the way vLLM and SGLang compute it, with the same ``forward`` as minisgl's
    MoE backends. configs: batch size -> tile config (default: the published H200 file)."""

    def __init__(self, configs: Dict[int, dict] | None = None):
        from minisgl.kernel.moe_routing import align  # chapter 21's alignment kernels

        self.align = align
        self.configs = configs if configs is not None else load_configs()

    def forward(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
    ) -> torch.Tensor:
        """hidden_states [T, H], w1 [E, 2I, H], w2 [E, H, I], gating_output [T, E] -> [T, H]."""
        from minisgl.layers.activation import silu_and_mul
        from minisgl.moe.base import select_experts

        num_tokens, hidden = hidden_states.shape
        config = nearest_config(self.configs, num_tokens)
        topk_weights, topk_ids = select_experts(gating_output, topk, renormalize)
        topk_ids = topk_ids.to(torch.int32).contiguous()
        num_experts = w1.shape[0]
        sorted_ids, expert_ids, num_padded = self.align(
            topk_ids, count_pairs(topk_ids, num_experts), num_experts, config["BLOCK_SIZE_M"]
        )
        weights = topk_weights.flatten()  # fp32, as the kernel scales its fp32 accumulator
        num_pairs = weights.numel()
        routing = (weights, sorted_ids, expert_ids, num_padded)
        gate_up = hidden_states.new_empty(num_pairs, w1.shape[1])  # [T*k, 2I]
        grouped_gemm(hidden_states, w1, gate_up, *routing, topk, False, config)
        activated = silu_and_mul(gate_up)  # [T*k, I]
        down = hidden_states.new_empty(num_pairs, hidden)  # [T*k, H], times the routing weight
        grouped_gemm(activated, w2, down, *routing, 1, True, config)
        return down.view(num_tokens, topk, hidden).sum(dim=1)
