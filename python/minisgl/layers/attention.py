from __future__ import annotations

import torch

from minisgl.core import get_global_ctx

from .base import BaseOP


class AttentionLayer(BaseOP):
    """Attention of the batch's new tokens over the KV cache, by the backend in the Context.

    It holds no weights: it hands q, k, v to ``ctx.attn_backend`` with its layer id, which tells
    the backend whose K and V to store and read. q: [T, Hq, D]; k, v: [T, Hkv, D] -> [T, Hq, D]
    """

    def __init__(self, layer_id: int):
        self.layer_id = layer_id

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_global_ctx()
        assert ctx.attn_backend is not None
        return ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
