from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .base import BaseCacheHandle, BasePrefixCache, InsertResult, SizeInfo


@dataclass(frozen=True)
class NaiveCacheHandle(BaseCacheHandle):
    def get_matched_indices(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int32)


class NaivePrefixCache(BasePrefixCache):
    """The prefix cache that keeps nothing: every request computes its whole prompt, and all its
    pages go back to the pool when it finishes. The baseline for the radix cache."""

    def __init__(self, page_size: int):
        self.page_size = page_size

    def match_prefix(self, input_ids: Sequence[int]) -> BaseCacheHandle:
        return NaiveCacheHandle(0)

    def insert_prefix(self, input_ids: Sequence[int], slots: torch.Tensor) -> InsertResult:
        return InsertResult(0, NaiveCacheHandle(0))  # not kept: the caller frees the slots

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        pass  # nothing is shared, so nothing needs protecting

    def evict(self, size: int) -> torch.Tensor:
        if size > 0:
            raise RuntimeError(f"cannot evict {size} tokens: the naive cache holds none")
        return torch.empty(0, dtype=torch.int32)

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable_size=0, protected_size=0)

    def check_integrity(self) -> None:
        pass
