"""Chapter 21's MoE: routing and alignment on the GPU (kernel/moe_routing.py), SiLU x up fused
into the first GEMM and tuned tile sizes per batch size (kernel/fused_moe.py, moe/configs.py).
No size is read on the host, so a decode step with MoE layers can be captured in a CUDA graph."""

from __future__ import annotations

import torch

from minisgl.kernel.fused_moe import down, gate_up_silu
from minisgl.kernel.moe_routing import align, route

from .base import BaseMoeBackend
from .configs import get_config


class FastMoeBackend(BaseMoeBackend):
    """Five launches a layer (route, plan, scatter, gate_up with SiLU, down) and the sum of k."""

    supports_cuda_graph = True

    def forward(self, hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                gating_output: torch.Tensor, topk: int, renormalize: bool) -> torch.Tensor:
        num_tokens, hidden = hidden_states.shape
        num_experts, inter = w1.shape[0], w2.shape[2]
        if num_tokens == 0:
            return hidden_states.new_empty(0, hidden)
        config = get_config(num_tokens, topk, num_experts, inter, hidden_states.dtype,
                            hidden_states.device)
        weights, topk_ids, block_counts = route(gating_output, topk, renormalize)
        sorted_ids, expert_ids, num_padded = align(topk_ids, block_counts, num_experts,
                                                   config["BLOCK_M"])
        x = hidden_states.contiguous()
        h = x.new_empty(sorted_ids.numel(), inter)  # [slots, I]: silu(gate) * up, slot order
        gate_up_silu(x, w1, h, sorted_ids, expert_ids, num_padded, topk, config["gate_up"])
        y = x.new_empty(num_tokens * topk, hidden)  # [T * k, H]: already times the weight
        down(h, w2, y, weights.view(-1), sorted_ids, expert_ids, num_padded, config["down"])
        return y.view(num_tokens, topk, hidden).sum(dim=1)
