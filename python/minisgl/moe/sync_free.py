"""A fused MoE with routing and alignment on the GPU (kernel/moe_routing.py), SiLU x up fused
into the first GEMM, tile sizes tuned per batch size (kernel/fused_moe.py, moe/configs.py), and
a three-launch path for a few tokens (kernel/moe_decode.py). No size is read on the host, so a
decode step with MoE layers can be captured in a CUDA graph."""

from __future__ import annotations

import torch

from minisgl.kernel.fused_moe import down, gate_up_silu, sum_choices
from minisgl.kernel.moe_decode import decode_moe
from minisgl.kernel.moe_routing import align, route

from .base import BaseMoeBackend
from .configs import MoeConfig, get_config


class SyncFreeMoeBackend(BaseMoeBackend):
    """A few tokens: three launches (route, gate_up with SiLU, down with the sum of each
    token's k outputs; kernel/moe_decode.py). More: seven (route, the chunks' sums, plan,
    scatter, gate_up with SiLU, down, the sum of each token's k outputs)."""

    supports_cuda_graph = True

    def forward(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
    ) -> torch.Tensor:
        config = get_config(
            hidden_states.shape[0],
            topk,
            w1.shape[0],
            w2.shape[2],
            hidden_states.dtype,
            hidden_states.device,
        )
        return self.forward_with(config, hidden_states, w1, w2, gating_output, topk, renormalize)

    def forward_with(
        self,
        config: MoeConfig,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
    ) -> torch.Tensor:
        """forward with the given tile sizes (the tuner tries each)."""
        num_tokens, hidden = hidden_states.shape
        if num_tokens == 0:
            return hidden_states.new_empty(0, hidden)
        x = hidden_states.contiguous()
        if config["path"] == "decode":
            return decode_moe(x, w1, w2, gating_output, topk, renormalize, config)
        num_experts, inter = w1.shape[0], w2.shape[2]
        weights, topk_ids, block_counts = route(gating_output, topk, renormalize)
        sorted_ids, expert_ids, num_padded = align(
            topk_ids, block_counts, num_experts, config["BLOCK_M"]
        )
        h = x.new_empty(sorted_ids.numel(), inter)  # [slots, I]: silu(gate) * up, slot order
        gate_up_silu(x, w1, h, sorted_ids, expert_ids, num_padded, topk, config["gate_up"])
        y = x.new_empty(num_tokens * topk, hidden)  # [T * k, H]: already times the weight
        down(h, w2, y, weights.view(-1), sorted_ids, expert_ids, num_padded, config["down"])
        return sum_choices(y, topk)
