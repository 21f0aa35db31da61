from __future__ import annotations

import torch

from .base import BaseKVCachePool


class MHAKVCachePool(BaseKVCachePool):
    """The KV pool of multi-head (and grouped-query) attention: one buffer for everything.

    buffer: [2, layers, pages, page_size, kv_heads, head_dim], K at index 0 and V at index 1.
    A page holds ``page_size`` consecutive tokens of one request; the backends address tokens by
    slot, through a view of the same storage, [2, layers, pages * page_size, kv_heads, head_dim].
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.num_pages, self.page_size = num_pages, page_size
        shape = (2, num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self.buffer = torch.zeros(shape, dtype=dtype, device=device)
        self._by_slot = self.buffer.view(
            2, num_layers, num_pages * page_size, num_kv_heads, head_dim
        )

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._by_slot[0, layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._by_slot[1, layer_id]

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        self._by_slot[0, layer_id, out_loc] = k
        self._by_slot[1, layer_id, out_loc] = v

    @property
    def bytes_per_page(self) -> int:
        return self.buffer[:, :, 0].numel() * self.buffer.element_size()
