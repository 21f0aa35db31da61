"""The attention backend interface: two verbs, one per batch and one per layer."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minisgl.core import Batch


class BaseAttnBackend(ABC):
    """Attention of a batch's new tokens over everything its requests have cached.

    ``prepare_metadata`` runs once per batch, before the forward: it turns the requests' lengths
    and page-table rows into what the layers need, stored in ``batch.attn_metadata``. ``forward``
    runs in every layer: it writes the new tokens' K and V into the KV cache, then attends.
    """

    supports_cuda_graph = False  # whether its decode can be captured in a CUDA graph

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None: ...

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hkv, D], the batch's T new tokens -> [T, Hq, D]."""

    def init_graph_buffers(self, max_bs: int) -> None:
        """Before CUDA graphs are captured: from now on put a decode batch's
        metadata, up to ``max_bs`` requests, in fixed buffers, where a replayed graph reads it."""
        raise NotImplementedError(f"{type(self).__name__} cannot run in a CUDA graph")
