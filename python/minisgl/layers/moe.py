"""The MoE layer: every expert's weights, packed; the computation is the Context's MoE backend's."""

from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import DistributedCommunicator, get_tp_info
from minisgl.layers.base import BaseOP
from minisgl.utils.misc import div_even


class MoELayer(BaseOP):
    """Every expert's weights packed into two 3-dimensional tensors; how to compute them is left to the
    MoE backend in the Context.

    gate_up_proj: [E, 2 * I_local, H] (each expert's gate and up concatenated)
    down_proj:    [E, H, I_local]
    Under tensor parallelism each expert's intermediate dimension I is split (as in a dense MLP),
    with an all-reduce at the end.
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool = True):
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self._comm = DistributedCommunicator()
        self.tp_size = get_tp_info().size
        local = div_even(intermediate_size, self.tp_size)
        self.gate_up_proj = torch.empty(num_experts, 2 * local, hidden_size)
        self.down_proj = torch.empty(num_experts, hidden_size, local)

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        out = get_global_ctx().moe_backend.forward(
            hidden_states=hidden_states,
            w1=self.gate_up_proj,
            w2=self.down_proj,
            gating_output=router_logits,
            topk=self.top_k,
            renormalize=self.renormalize,
        )
        return self._comm.all_reduce(out) if self.tp_size > 1 else out
