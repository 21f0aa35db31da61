"""The KV cache: the pool that holds every cached token's K and V, and the prefix caches that
let requests share them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.utils.misc import div_even, get_tp_info

from .base import BaseCacheHandle, BaseKVCachePool, BasePrefixCache
from .mha_pool import MHAKVCachePool
from .naive_cache import NaivePrefixCache
from .radix_cache import RadixPrefixCache

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig


def create_kvcache_pool(
    config: ModelConfig,
    num_pages: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> BaseKVCachePool:
    """A pool for ``config``'s layers and this rank's KV heads."""
    num_kv_heads = div_even(config.num_kv_heads, get_tp_info().size)
    return MHAKVCachePool(
        config.num_layers, num_kv_heads, config.head_dim, num_pages, page_size, dtype, device
    )


def create_prefix_cache(kind: str, page_size: int) -> BasePrefixCache:
    """The prefix cache ``kind``: "radix" (shares prefixes) or "naive" (keeps nothing)."""
    if kind == "radix":
        return RadixPrefixCache(page_size)
    if kind == "naive":
        return NaivePrefixCache(page_size)
    raise ValueError(f"unknown prefix cache {kind!r}; known: naive, radix")


__all__ = [
    "BaseCacheHandle",
    "BaseKVCachePool",
    "BasePrefixCache",
    "MHAKVCachePool",
    "NaivePrefixCache",
    "RadixPrefixCache",
    "create_kvcache_pool",
    "create_prefix_cache",
]
