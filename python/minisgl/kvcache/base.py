"""What a KV cache pool offers the attention backends, and what a prefix cache offers the
scheduler."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple, Sequence

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


@dataclass(frozen=True)
class BaseCacheHandle(ABC):
    """A request's hold on a prefix in the prefix cache: its first ``cached_len`` tokens."""

    cached_len: int

    @abstractmethod
    def get_matched_indices(self) -> torch.Tensor:
        """The KV slots of those tokens: [cached_len], int32."""


class SizeInfo(NamedTuple):
    """Tokens held by the prefix cache: those it may evict, and those requests hold locked."""

    evictable_size: int
    protected_size: int

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size


class InsertResult(NamedTuple):
    cached_len: int  # how much of the inserted prefix the cache held already
    handle: BaseCacheHandle  # the inserted prefix (page-aligned: a partial last page is not kept)


class BasePrefixCache(ABC):
    """Token sequences whose K and V stay in the pool after their request is done, so that a
    later request starting the same way reuses them. Sizes count tokens, not pages.

    A matched prefix may be used only while its handle is locked: ``evict`` never takes a locked
    token's slots. Lock before use, unlock when done (reference counts)."""

    @abstractmethod
    def match_prefix(self, input_ids: Sequence[int]) -> BaseCacheHandle:
        """The longest cached prefix of ``input_ids``. No tokens come or go, though the cache
        may reorganize itself (a radix tree splits an edge)."""

    @abstractmethod
    def insert_prefix(self, input_ids: Sequence[int], slots: torch.Tensor) -> InsertResult:
        """Keep ``input_ids`` [n] whose K and V are in ``slots`` [n]."""

    @abstractmethod
    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None: ...

    @abstractmethod
    def evict(self, size: int) -> torch.Tensor:
        """Drop at least ``size`` unlocked tokens; their slots (int32). ``evict(0)`` is a no-op."""

    @property
    @abstractmethod
    def size_info(self) -> SizeInfo: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise when the cache's bookkeeping is inconsistent."""
