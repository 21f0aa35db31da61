"""The reference attention backend: plain torch, one request at a time (the default on a CPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import torch

from minisgl.core import Batch, get_global_ctx

from .base import BaseAttnBackend
from .utils import attend

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig


@dataclass
class TorchAttnMetadata:
    """Per request of the batch, in order: how many tokens were cached before this forward, how
    many it adds, and the KV slots of all of them (read from its page-table row)."""

    cached_lens: List[int]
    extend_lens: List[int]
    kv_slots: List[torch.Tensor]  # each [cached_len + extend_len], int64


class TorchAttnBackend(BaseAttnBackend):
    def __init__(self, config: ModelConfig, device: torch.device | str):
        self.config = config  # a faster backend would size its buffers from it

    def prepare_metadata(self, batch: Batch) -> None:
        page_table = get_global_ctx().page_table
        assert page_table is not None
        batch.attn_metadata = TorchAttnMetadata(
            cached_lens=[r.cached_len for r in batch.reqs],
            extend_lens=[r.extend_len for r in batch.reqs],
            kv_slots=[page_table[r.table_idx, : r.device_len].long() for r in batch.reqs],
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        kv_cache, meta = get_global_ctx().kv_cache, batch.attn_metadata
        assert kv_cache is not None and batch.out_loc is not None
        kv_cache.store_kv(k, v, batch.out_loc, layer_id)  # first: a token sees its own K, V
        k_cache, v_cache = kv_cache.k_cache(layer_id), kv_cache.v_cache(layer_id)
        outputs = [
            attend(q_req, k_cache[slots], v_cache[slots], cached)
            for q_req, cached, slots in zip(
                q.split(meta.extend_lens), meta.cached_lens, meta.kv_slots
            )
        ]
        return torch.cat(outputs)
