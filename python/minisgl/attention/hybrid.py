"""Two backends in one: one for prefill batches, another for decode batches.

A prefill is long and compute-bound; a decode step is one token per request and bound by reading
the KV cache. The best kernel for one is not the best for the other, so the engine may take them
from different backends: ``attention_backend="triton,torch"`` prefills with Triton and decodes
with the reference. Each batch goes whole to one of them, chosen by its phase.
"""

from __future__ import annotations

import torch

from minisgl.core import Batch

from .base import BaseAttnBackend


class HybridAttnBackend(BaseAttnBackend):
    def __init__(self, prefill: BaseAttnBackend, decode: BaseAttnBackend):
        self.prefill, self.decode = prefill, decode
        self.supports_cuda_graph = decode.supports_cuda_graph  # graphs run decode batches only

    def init_graph_buffers(self, max_bs: int) -> None:
        self.decode.init_graph_buffers(max_bs)

    def _for(self, batch: Batch) -> BaseAttnBackend:
        return self.prefill if batch.is_extend else self.decode

    def prepare_metadata(self, batch: Batch) -> None:
        self._for(batch).prepare_metadata(batch)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        return self._for(batch).forward(q, k, v, layer_id, batch)
