from __future__ import annotations

from typing import List

import torch

from minisgl.core import Req
from minisgl.kvcache.base import BaseCacheHandle, BasePrefixCache
from minisgl.utils.misc import div_ceil


class CacheManager:
    """The KV pool's pages: which are free, which a request holds, which the prefix cache keeps.

    A request's page-table row lists a slot per token; its pages are given as its tokens need
    them (``allocate``) and, when it finishes, go to the prefix cache or back to the free list
    (``cache_req``). When the free list runs dry, the prefix cache evicts unlocked pages.
    """

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor,
                 prefix_cache: BasePrefixCache):
        self.num_pages, self.page_size = num_pages, page_size
        self.page_table = page_table
        self.prefix_cache = prefix_cache
        self.free_pages: List[int] = list(range(num_pages))

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    @property
    def available_pages(self) -> int:
        """Pages a request could get now: the free ones and those the prefix cache may evict."""
        return len(self.free_pages) + self.prefix_cache.size_info.evictable_size // self.page_size

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
        for req in reqs:
            first, last = div_ceil(req.cached_len, size), div_ceil(req.device_len, size)
            if last > first:
                pages = torch.tensor(self._take(last - first), dtype=torch.int32)
                slots = (pages[:, None] * size + torch.arange(size, dtype=torch.int32)).flatten()
                self.page_table[req.table_idx, first * size : last * size] = slots

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Give the request's cached tokens to the prefix cache. Finished: it unlocks them and
        frees the pages the cache did not keep. Running: it keeps them, locked by a new handle.

        Tokens [old.cached_len, in_tree) may have reached the cache through another request
        since this one was admitted: its row then points at the cache's slots, its own are freed.
        """
        n, old = req.cached_len, req.cache_handle
        row = self.page_table[req.table_idx, :n]  # a view: writing it writes the page table
        in_tree, handle = self.prefix_cache.insert_prefix(req.all_ids[:n], row)
        if in_tree > old.cached_len:
            duplicates = row[old.cached_len : in_tree].clone()
            row[old.cached_len : in_tree] = handle.get_matched_indices()[old.cached_len : in_tree]
            self._free(duplicates)
        if finished:
            self._free(row[handle.cached_len :])  # the tail the cache did not keep
            self.unlock(old)
        else:
            self.lock(handle)
            self.unlock(old)
            req.cache_handle = handle

    def check_integrity(self) -> None:
        """Every page is free or held by the prefix cache: call it when no request runs."""
        self.prefix_cache.check_integrity()
        cached = self.prefix_cache.size_info.total_size // self.page_size
        if len(self.free_pages) + cached != self.num_pages or len(set(self.free_pages)) != len(
                self.free_pages):
            raise RuntimeError(f"pages lost: {len(self.free_pages)} free + {cached} cached "
                               f"!= {self.num_pages}")

    def _take(self, n: int) -> List[int]:
        if n > len(self.free_pages):
            evicted = self.prefix_cache.evict((n - len(self.free_pages)) * self.page_size)
            self._free(evicted)
        if n > len(self.free_pages):
            raise RuntimeError(f"out of KV pages: {n} needed, {len(self.free_pages)} free")
        taken, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return taken

    def _free(self, slots: torch.Tensor) -> None:
        """Give back the pages of ``slots`` (whole pages: they start on a page boundary)."""
        self.free_pages.extend((slots[:: self.page_size] // self.page_size).tolist())
