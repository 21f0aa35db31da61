"""Prefill admission under a token budget, long prompts in chunks (chunked prefill)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from minisgl.core import Batch, Req

from .cache import CacheManager
from .decode import DecodeManager
from .table import TableManager
from .utils import pages_to_finish


@dataclass
class PrefillManager:
    """The requests waiting for (the rest of) their prefill, in order of arrival.

    Each prefill batch takes at most ``budget`` prompt tokens. A prompt that does not fit whole
    runs in chunks, one per step: it stays at the head of the queue, admitted (a row, its pages
    reserved), until its last chunk has run; only then is its first token sampled. So no
    forward runs more than ``budget`` tokens, however long the prompt: the activations' memory
    and the time of one step stay bounded.
    """

    cache_manager: CacheManager
    table_manager: TableManager
    decode_manager: DecodeManager
    page_size: int
    waiting: List[Req] = field(default_factory=list)

    def add_req(self, req: Req) -> None:
        self.waiting.append(req)

    @property
    def runnable(self) -> bool:
        return len(self.waiting) > 0

    def schedule_next_batch(self, budget: int) -> Batch | None:
        """The next prefill batch: in order, each request's next chunk while the budget lasts
        and a new request fits (a row, and pages for all it may still need)."""
        admitted = [r for r in self.waiting if r.table_idx >= 0]  # mid-prefill, in chunks
        reserved = self.decode_manager.reserved_pages(self.page_size) + sum(
            pages_to_finish(r, self.page_size) for r in admitted
        )
        reqs: List[Req] = []
        for req in self.waiting:
            if budget <= 0:
                break
            if req.table_idx < 0:
                needed = self._try_admit(req, reserved)
                if needed is None:
                    break
                reserved += needed
            chunk = min(budget, len(req.input_ids) - req.cached_len)
            req.device_len = req.cached_len + chunk
            budget -= chunk
            reqs.append(req)
        done = [r for r in reqs if r.device_len == len(r.input_ids)]
        self.waiting = [r for r in self.waiting if r not in done]
        return Batch(reqs, "prefill") if reqs else None

    def _try_admit(self, req: Req, reserved: int) -> int | None:
        """Give the request a row and its cached prefix; the pages it may still take, or None
        when there is no row or not enough pages beyond ``reserved``."""
        if self.table_manager.available_size == 0:
            return None
        handle = self.cache_manager.match_req(req)
        self.cache_manager.lock(handle)  # before counting: locked pages cannot be evicted
        req.cached_len = handle.cached_len
        needed = pages_to_finish(req, self.page_size)
        if needed + reserved > self.cache_manager.available_pages:
            self.cache_manager.unlock(handle)
            req.cached_len = 0
            return None
        req.table_idx = self.table_manager.allocate()
        req.cache_handle = handle
        self.cache_manager.page_table[req.table_idx, : handle.cached_len] = (
            handle.get_matched_indices()
        )
        return needed
