from __future__ import annotations

from typing import List

import torch

from minisgl.core import Req
from minisgl.kvcache.base import BaseCacheHandle, BasePrefixCache
from minisgl.utils.misc import div_ceil


class CacheManager:
    """The KV pool's pages: which are free, which a request holds, which the prefix cache keeps.

    A request's page-table row lists a slot per token; its pages are given as its tokens need
    them (``allocate``) and, when it finishes, go to the prefix cache or back to the free pages
    (``cache_req``). When free pages run out, the prefix cache evicts unlocked pages.

    The free pages wait in a queue kept in one fixed tensor (a ring): pages leave at its head and
    come back at its tail, so taking or giving n pages costs O(n), however large the pool.
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        page_table: torch.Tensor,
        prefix_cache: BasePrefixCache,
    ):
        self.num_pages, self.page_size = num_pages, page_size
        self.page_table = page_table
        self.prefix_cache = prefix_cache
        self._ring = torch.arange(num_pages, dtype=torch.int32, device=page_table.device)
        self._head = 0  # the ring's index of the next page to hand out
        self._num_free = num_pages  # free pages: ring[head], ring[head + 1], ... (mod num_pages)

    @property
    def num_free_pages(self) -> int:
        return self._num_free

    @property
    def available_pages(self) -> int:
        """Pages a request could get now: the free ones and those the prefix cache may evict."""
        return self._num_free + self.prefix_cache.size_info.evictable_size // self.page_size

    def match_req(self, req: Req) -> BaseCacheHandle:
        """The cached prefix of the prompt, short of its last token (whose logits we need)."""
        return self.prefix_cache.match_prefix(req.input_ids[:-1])

    def lock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle)

    def unlock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=True)

    def allocate(self, reqs: List[Req]) -> None:
        """Pages for every request's positions [cached_len, device_len), into its row."""
        size = self.page_size
        offsets = torch.arange(size, dtype=torch.int32, device=self.page_table.device)
        for req in reqs:
            first, last = div_ceil(req.cached_len, size), div_ceil(req.device_len, size)
            if last > first:
                slots = (self._take(last - first)[:, None] * size + offsets).flatten()
                self.page_table[req.table_idx, first * size : last * size] = slots

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Give the request's cached tokens to the prefix cache. Finished: it unlocks them and
        frees the pages the cache did not keep. Running: it keeps them, locked by a new handle."""
        n, old = req.cached_len, req.cache_handle
        row = self.page_table[req.table_idx, :n]
        _, handle = self.prefix_cache.insert_prefix(req.all_ids[:n], row)
        if finished:
            self._free(row[handle.cached_len :])  # the tail the cache did not keep
            self.unlock(old)
        else:
            self.lock(handle)
            self.unlock(old)
            req.cache_handle = handle

    def check_integrity(self, exhaustive: bool = False) -> None:
        """Every page is free or held by the prefix cache: call it when no request runs.

        The counts cost nothing, so the scheduler checks them whenever it falls idle;
        ``exhaustive`` also checks that no page is free twice, at a cost that grows with the pool.
        """
        self.prefix_cache.check_integrity()
        info = self.prefix_cache.size_info
        cached = info.total_size // self.page_size
        if info.protected_size != 0:
            raise RuntimeError(f"{info.protected_size} cached tokens still locked, none running")
        if self._num_free + cached != self.num_pages:
            raise RuntimeError(
                f"pages lost: {self._num_free} free + {cached} cached != {self.num_pages}"
            )
        if exhaustive and self._free_page_list().unique().numel() != self._num_free:
            raise RuntimeError("a page is free twice")

    def _take(self, n: int) -> torch.Tensor:
        """n free pages, evicting from the prefix cache first if too few are free: [n], int32."""
        if n > self.available_pages:
            raise RuntimeError(
                f"out of KV pages: {n} needed, {self._num_free} free and "
                f"{self.available_pages - self._num_free} evictable"
            )
        if n > self._num_free:
            self._free(self.prefix_cache.evict((n - self._num_free) * self.page_size))  # tokens
        pages = self._ring[self._ring_index(self._head, n)]
        self._head = (self._head + n) % self.num_pages
        self._num_free -= n
        return pages

    def _free(self, slots: torch.Tensor) -> None:
        """Give back the pages of ``slots`` (whole pages: they start on a page boundary)."""
        pages = slots[:: self.page_size] // self.page_size
        self._ring[self._ring_index(self._head + self._num_free, len(pages))] = pages.to(
            self._ring.dtype
        )
        self._num_free += len(pages)

    def _ring_index(self, start: int, n: int) -> torch.Tensor:
        """Positions start, start + 1, ..., start + n - 1 of the ring, wrapped around."""
        return torch.arange(start, start + n, device=self._ring.device) % self.num_pages

    def _free_page_list(self) -> torch.Tensor:
        return self._ring[self._ring_index(self._head, self._num_free)]
