"""Draft-model drafts: a smaller model with the same tokenizer runs k greedy steps ahead of
each request, in an engine of its own (its weights, its KV pool, no prefix cache)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Sequence

from minisgl.core import Batch, Req, SamplingParams
from minisgl.utils.misc import div_ceil

if TYPE_CHECKING:
    from minisgl.engine.engine import Engine
    from minisgl.scheduler.cache import CacheManager


class DraftModel:
    """Each target request has a mirror here: the same tokens and page-table row, the draft's
    own pages, and ``cached_len`` up to where the draft's K and V are valid. A step catches
    the mirror up on the tokens it has not run (the whole prompt at first; then the tokens
    the target accepted), then decodes until it has its k drafts."""

    def __init__(self, engine: Engine, cache: CacheManager, target_vocab: int, max_seq_len: int):
        """``engine`` runs the draft model; ``cache`` allocates the pages of its KV pool."""
        vocab, path = engine.model_config.vocab_size, engine.config.model_path
        if vocab != target_vocab:
            raise ValueError(
                f"draft model {path!r} has {vocab} tokens, the target "
                f"{target_vocab}: a draft must share the target's tokenizer"
            )
        if engine.max_seq_len < max_seq_len:
            raise ValueError(
                f"the draft's KV pool holds {engine.max_seq_len} tokens, "
                f"a request may have {max_seq_len}: give it more pages"
            )
        self.engine, self.cache, self.page_size = engine, cache, engine.config.page_size
        self.mirrors: Dict[Req, Req] = {}

    def propose(self, reqs: Sequence[Req], ks: Sequence[int]) -> List[List[int]]:
        """Up to ks[i] greedy draft tokens for each request (none for a request whose mirror
        finds no free pages: it decodes without drafts this step)."""
        drafts: List[List[int]] = [[] for _ in reqs]
        todo = [(i, self._mirror(req, k)) for i, (req, k) in enumerate(zip(reqs, ks)) if k > 0]
        todo = [(i, m) for i, m in todo if self._reserve(m, ks[i])]
        for step in range(max(ks, default=0)):
            todo = [(i, m) for i, m in todo if len(drafts[i]) < ks[i]]
            if not todo:
                break
            mirrors = [m for _, m in todo]
            phase = "prefill" if any(m.extend_len > 1 for m in mirrors) else "decode"
            tokens = self.engine.forward_batch(Batch(mirrors, phase)).tolist()
            for (i, mirror), token in zip(todo, tokens):
                mirror.append(token)
                drafts[i].append(token)
        return drafts

    def accepted(self, req: Req, kept_len: int) -> None:
        """The target kept its first ``kept_len`` tokens (its new ``cached_len``): the draft's
        K and V past them were computed for drafts the target refused; give their pages back."""
        mirror = self.mirrors.get(req)
        if mirror is None:
            return
        held = mirror.cached_len
        mirror.cached_len = min(mirror.cached_len, kept_len)
        self.cache.free_tail(mirror, held)

    def remove(self, req: Req) -> None:
        """The request has finished: its mirror's pages go back."""
        mirror = self.mirrors.pop(req, None)
        if mirror is not None:  # the naive cache keeps none of it
            self.cache.cache_req(mirror, finished=True)

    def check_integrity(self) -> None:
        self.cache.check_integrity()

    def _mirror(self, req: Req, k: int) -> Req:
        """The request's mirror, holding the request's tokens now (those the draft has run
        first, so its cached_len stays valid)."""
        mirror = self.mirrors.get(req)
        if mirror is None:
            mirror = Req(
                req.uid,
                [],
                SamplingParams(max_tokens=1),
                table_idx=req.table_idx,
                cache_handle=self.cache.prefix_cache.match_prefix([]),
            )
            self.mirrors[req] = mirror
        mirror.input_ids, mirror.output_ids = list(req.all_ids), []
        mirror.device_len = len(mirror.input_ids)
        return mirror

    def _reserve(self, mirror: Req, k: int) -> bool:
        """Pages for the mirror's tokens and its first k - 1 drafts (the last is never run),
        taken now; False, and nothing taken, when too few are free."""
        end = mirror.device_len + k - 1
        needed = div_ceil(end, self.page_size) - div_ceil(mirror.cached_len, self.page_size)
        if needed > self.cache.num_free_pages:
            return False
        device_len, mirror.device_len = mirror.device_len, end
        self.cache.allocate([mirror])
        mirror.device_len = device_len
        return True
