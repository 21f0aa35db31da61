from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from minisgl.utils.misc import div_even, get_tp_info

from .base import BaseOP


class _Linear(BaseOP):
    """``y = x @ weight.T + bias`` on this rank's part of the weight.

    weight: [local_output_size, local_input_size]; bias: [local_output_size] or None.
    x: [T, local_input_size] -> y: [T, local_output_size]
    """

    def __init__(self, local_input_size: int, local_output_size: int, has_bias: bool):
        self.weight = torch.empty(local_output_size, local_input_size)
        self.bias = torch.empty(local_output_size) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class LinearReplicated(_Linear):
    """Every rank holds the whole weight (small layers such as the MoE router)."""

    def __init__(self, input_size: int, output_size: int, has_bias: bool = False):
        super().__init__(input_size, output_size, has_bias)


class LinearColParallel(_Linear):
    """The output features are split over the ranks: each computes a slice of ``y``."""

    def __init__(self, input_size: int, output_size: int, has_bias: bool = False):
        tp_size = get_tp_info().size
        super().__init__(input_size, div_even(output_size, tp_size), has_bias)


class LinearColParallelMerged(_Linear):
    """Several column-parallel layers over the same input, run as one matmul.

    The MLP's gate and up projections become one ``gate_up_proj``: ``output_sizes = [I, I]`` and
    weight: [2 * I_local, H], the gate rows first, then the up rows. Each part is split over the
    ranks separately, so every rank holds a matching slice of gate and of up.
    """

    def __init__(self, input_size: int, output_sizes: Sequence[int], has_bias: bool = False):
        tp_size = get_tp_info().size
        self.output_sizes = [div_even(size, tp_size) for size in output_sizes]  # local sizes
        super().__init__(input_size, sum(self.output_sizes), has_bias)


class LinearQKVMerged(_Linear):
    """The attention's q, k and v projections as one matmul.

    weight: [(Hq + 2 * Hkv) * D, hidden], rows ordered q, k, v; heads are split over the ranks.
    ``split`` cuts the output back into q: [T, Hq * D], k and v: [T, Hkv * D].
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_qo_heads: int,
        num_kv_heads: int,
        has_bias: bool = False,
    ):
        tp_size = get_tp_info().size
        self.head_dim = head_dim
        self.num_qo_heads = div_even(num_qo_heads, tp_size)  # heads on this rank
        self.num_kv_heads = div_even(num_kv_heads, tp_size)
        local_output = (self.num_qo_heads + 2 * self.num_kv_heads) * head_dim
        super().__init__(hidden_size, local_output, has_bias)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_size, kv_size = self.num_qo_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        return q, k, v


class LinearRowParallel(_Linear):
    """The input features are split over the ranks: each computes a partial sum of ``y``.

    It follows a column-parallel layer (``o_proj`` after attention, ``down_proj`` after the MLP),
    whose output slice is exactly this layer's input slice.
    """

    def __init__(self, input_size: int, output_size: int, has_bias: bool = False):
        tp_size = get_tp_info().size
        super().__init__(div_even(input_size, tp_size), output_size, has_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        # with several ranks the partial sums are all-reduced here, before the bias
        return y if self.bias is None else y + self.bias
