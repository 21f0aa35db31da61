from __future__ import annotations

from typing import List, Tuple

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
        self._offsets = torch.arange(page_size, dtype=torch.int32, device=page_table.device)
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
        """The cached prefix of the prompt, short of its last token (whose logits we need). A
        request that asks its prompt's log-probabilities matches nothing: a cached prefix has
        K and V but no logits, and each of its positions needs its own."""
        if req.needs_prompt_logits:
            return self.prefix_cache.match_prefix([])
        return self.prefix_cache.match_prefix(req.input_ids[:-1])

    def lock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle)

    def unlock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=True)

    def allocate(self, reqs: List[Req]) -> None:
        """Pages for every request's positions [cached_len, device_len), into its row.

        The step's pages are taken at once and written with one scatter: where each new slot
        goes in the page table is host arithmetic, sent in one copy, so the device's work does
        not grow with the number of requests that cross a page boundary.
        """
        size, width = self.page_size, self.page_table.shape[1]
        starts: List[int] = []  # the page table's flat index of each new page's first slot
        for req in reqs:
            first, last = div_ceil(req.cached_len, size), div_ceil(req.device_len, size)
            row = req.table_idx * width
            starts.extend(range(row + first * size, row + last * size, size))
        if not starts:
            return
        where = (torch.tensor(starts)[:, None] + torch.arange(size)).flatten()
        on_gpu = self.page_table.device.type == "cuda"
        where = where.pin_memory() if on_gpu else where  # pinned: the copy waits for nothing
        pages = self._take(len(starts))
        slots = torch.add(self._offsets, pages[:, None], alpha=size)  # [pages, size]
        self.page_table.view(-1)[where.to(self.page_table.device, non_blocking=True)] = (
            slots.flatten()
        )

    def free_tail(self, req: Req, held_len: int) -> None:
        """Give back the pages the request took for positions [cached_len, held_len) and no
        longer needs: the K and V of draft tokens the target refused. A page
        holding any position below cached_len stays, however much of it was refused."""
        size, row = self.page_size, req.table_idx
        first, last = div_ceil(req.cached_len, size), div_ceil(held_len, size)
        if last > first:
            self._free(self.page_table[row, first * size : last * size])

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Give the request's cached tokens to the prefix cache. Finished: it unlocks them and
        frees the pages the cache did not keep. Running: it keeps them, locked by a new handle.

        Tokens [old.cached_len, in_tree) may have reached the cache through another request
        since this one was admitted: its row then points at the cache's slots, its own are freed.

        Only tokens the host has go to the cache, less the last (never run without overlap):
        with overlap a later forward may have cached more, so the cache holds the
        same tokens with overlap on and off. A finished request's pages are freed to the end.
        """
        n, old = min(req.cached_len, len(req.all_ids) - 1), req.cache_handle
        row = self.page_table[req.table_idx, :n]  # a view: writing it writes the page table
        in_tree, handle = self.prefix_cache.insert_prefix(req.all_ids[:n], row)
        if in_tree > old.cached_len:
            duplicates = row[old.cached_len : in_tree].clone()
            row[old.cached_len : in_tree] = handle.get_matched_indices()[old.cached_len : in_tree]
            self._free(duplicates)
        if finished:  # the tail the cache did not keep
            self._free(self.page_table[req.table_idx, handle.cached_len : req.cached_len])
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
        pages = torch.cat(self._ring_segments(self._head, n))
        self._head = (self._head + n) % self.num_pages
        self._num_free -= n
        return pages

    def _free(self, slots: torch.Tensor) -> None:
        """Give back the pages of ``slots`` (whole pages: they start on a page boundary)."""
        pages = slots[:: self.page_size] // self.page_size
        before_end, wrapped = self._ring_segments(self._head + self._num_free, len(pages))
        before_end.copy_(pages[: len(before_end)])
        wrapped.copy_(pages[len(before_end) :])
        self._num_free += len(pages)

    def _ring_segments(self, start: int, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Positions start, start + 1, ..., start + n - 1 of the ring (mod its length), as two
        views: those before the ring's end, then those wrapped around to its start (often none).
        Views, not an index tensor: reading or writing them is one copy, with no index to build.
        """
        start %= self.num_pages
        end = min(start + n, self.num_pages)
        return self._ring[start:end], self._ring[: n - (end - start)]

    def _free_page_list(self) -> torch.Tensor:
        return torch.cat(self._ring_segments(self._head, self._num_free))
