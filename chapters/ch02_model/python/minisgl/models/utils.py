from __future__ import annotations

import torch

from minisgl.layers.activation import silu_and_mul
from minisgl.layers.base import BaseOP
from minisgl.layers.linear import LinearColParallelMerged, LinearRowParallel

from .config import ModelConfig


class GatedMLP(BaseOP):
    """The dense SwiGLU MLP: ``down(silu(gate(x)) * up(x))``, gate and up as one matmul.

    gate_up_proj.weight: [2 * I, H]; down_proj.weight: [H, I]; x: [T, H] -> [T, H]
    """

    def __init__(self, config: ModelConfig):
        if config.hidden_act != "silu":
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}: only 'silu'")
        size = config.intermediate_size
        self.gate_up_proj = LinearColParallelMerged(config.hidden_size, [size, size])
        self.down_proj = LinearRowParallel(size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(silu_and_mul(self.gate_up_proj.forward(x)))


def build_mlp(config: ModelConfig, layer_id: int) -> BaseOP:
    """The MLP of decoder layer ``layer_id``: the one place a layer's MLP kind is decided."""
    if config.is_moe_layer(layer_id):
        raise NotImplementedError(
            f"layer {layer_id} of this {config.architecture} is a mixture of experts: "
            "MoE models arrive in chapter 20"
        )
    return GatedMLP(config)
