"""What a KV cache pool offers the attention backends."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class BaseKVCachePool(ABC):
    """The K and V of every cached token of every layer, addressed by slot: slot
    ``page * page_size + offset`` holds one token's K (or V), [kv_heads, head_dim]."""

    @abstractmethod
    def k_cache(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s keys by slot: [num_slots, kv_heads, head_dim]."""

    @abstractmethod
    def v_cache(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s values by slot: [num_slots, kv_heads, head_dim]."""

    @abstractmethod
    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Write the K and V of T new tokens: k, v: [T, kv_heads, head_dim] into slots
        out_loc: [T]."""
