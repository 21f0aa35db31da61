"""The MoE backend's interface and the routing every backend shares."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Tuple

import torch


def select_experts(
    gating_output: torch.Tensor, topk: int, renormalize: bool
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Routing: take the top-k experts after a softmax, optionally renormalizing those k weights to sum to 1."""
    probs = torch.softmax(gating_output.float(), dim=-1)
    topk_weights, topk_ids = probs.topk(topk, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


class BaseMoeBackend(ABC):
    """How an MoE layer computes its experts; the layer holds the weights, the backend the method.

    hidden_states: [T, H]; w1: [E, 2 * I, H] (gate rows, then up rows); w2: [E, H, I];
    gating_output: the router's logits [T, E]. Returns [T, H]: each token's k expert outputs,
    weighted by routing and summed.
    """

    # whether forward reads nothing on the host, so a CUDA graph can hold it
    supports_cuda_graph: bool = False

    @abstractmethod
    def forward(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
    ) -> torch.Tensor: ...
