"""The scheduler's speculative decode step: k drafts a request, run with its last
token as one extend of k + 1 tokens, and the longest run the target agrees with kept."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, List, Sequence, Tuple

import torch

from minisgl.core import Batch, Req
from minisgl.engine.engine import Engine
from minisgl.engine.sample import BatchSamplingArgs, row_seed
from minisgl.kvcache import create_prefix_cache
from minisgl.speculative import DraftModel, DraftRule, NgramDrafter, accept_batch

from .cache import CacheManager
from .config import SchedulerConfig

Mask = Callable[[torch.Tensor], None]  # structured output's mask, by batch row


@dataclass
class SpeculativeStats:
    """What speculation has done so far: verify forwards of the target, request-steps in them,
    drafts proposed and kept. Decode steps in which no request drafted are not counted."""

    forwards: int = 0  # verify forwards of the target, one a step
    steps: int = 0  # one per request per step
    proposed: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a request got per step: its accepted drafts and the target's own token."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


class Speculator:
    """Runs a decode batch speculatively. Each request proposes up to k drafts (fewer near
    max_tokens; none under a grammar, whose matcher cannot look ahead here, or while its drafts
    do not pay), all requests' tokens run as one extend over the paged KV, and each keeps the
    drafts the target agrees with, then one token of the target's own. The K and V of refused
    drafts are in pages the request then gives back; its cached_len ends after the last token
    kept. A step in which no request has a draft runs as a decode step."""

    def __init__(self, config: SchedulerConfig, engine: Engine, cache_manager: CacheManager):
        self.k, self.engine, self.cache_manager = config.speculative_k, engine, cache_manager
        self.drafter: NgramDrafter | DraftModel = (
            NgramDrafter() if config.speculative == "ngram" else draft_model(config, engine)
        )
        # unseeded requests' draws, on the device where the verify logits are
        self._generator = torch.Generator(device=engine.device).manual_seed(config.seed)
        self.stats = SpeculativeStats()
        self.rule = DraftRule(config.speculative_max_batch, config.speculative_min_tokens)
        engine.capture_verify_graphs(self.k + 1)  # on a GPU: verify steps replay a graph

    @torch.inference_mode()  # the verify logits are inference tensors, edited by the mask
    def decode(
        self, batch: Batch, constrained: Sequence[bool], mask: Mask | None
    ) -> Tuple[List[List[int]], List[int]]:
        """One step of ``batch``: each request's run of new tokens (1 to k + 1), which the host
        appends as if they had been sampled one per step, and the tokens each ran. ``mask``
        edits the logits rows of the constrained requests, which draft nothing."""
        reqs = batch.reqs
        ks = [0 if c else self._k_for(r) for r, c in zip(reqs, constrained)]
        with self.engine.timer.phase("draft"):
            drafts = self.drafter.propose(reqs, ks)
        if not self.rule.batch_pays(reqs, [len(d) > 0 for d in drafts]):
            return self._decode(batch, mask)  # a decode step costs less than this verify step
        drafted = [len(d) for d in drafts]  # the request's own, before any padding
        if self._can_pad(reqs):  # a graph needs k drafts a request, whatever each may keep
            drafts = [_padded(r, d, self.k) for r, d in zip(reqs, drafts)]
        start_lens = [r.device_len for r in reqs]
        for req, draft in zip(reqs, drafts):  # run as if sampled, so the forward reads them
            req.output_ids.extend(draft)
            req.device_len += len(draft)
        self._allocate(reqs)
        logits = self.engine.verify_logits(Batch(reqs, "verify"))  # [sum(len(d) + 1), V]
        for req, draft in zip(reqs, drafts):
            del req.output_ids[len(req.output_ids) - len(draft) :]
        starts = torch.tensor([0] + [len(d) + 1 for d in drafts[:-1]]).cumsum(0)
        if mask is not None:  # a constrained request's one row: the first, it drafts nothing
            rows = starts + torch.tensor([min(k, len(d)) for k, d in zip(ks, drafts)])
            own = logits[rows]
            mask(own)
            logits[rows] = own
        with self.engine.timer.phase("accept"):
            runs = self._verify(reqs, drafts, logits)
        runs = [run[: k + 1] for run, k in zip(runs, ks)]  # no more than the request may keep
        self.stats.forwards += 1
        for req, run, start, k, draft, own in zip(reqs, runs, start_lens, ks, drafts, drafted):
            self._keep(req, run, start)
            self.rule.record(req, own, len(run))
            self.stats.steps += 1
            self.stats.proposed += min(len(draft), k)  # the drafts it could have kept
            self.stats.accepted += len(run) - 1
        return runs, [len(d) + 1 for d in drafts]

    def wants(self, reqs: Sequence[Req], constrained: Sequence[bool]) -> bool:
        """Whether a decode step of ``reqs`` should verify drafts: the batch is not too large
        for them and the requests that may draft (free, below max_tokens, not paused) are
        expected to make the step pay for the batch."""
        drafting = [not c and self._k_for(r) > 0 for r, c in zip(reqs, constrained)]
        return self.rule.batch_drafts(len(reqs)) and self.rule.batch_pays(reqs, drafting)

    def remove(self, req: Req) -> None:
        self.drafter.remove(req)
        self.rule.remove(req)

    def _decode(self, batch: Batch, mask: Mask | None) -> Tuple[List[List[int]], List[int]]:
        """The step as a decode step: one token a request, sampled by the engine."""
        start_lens = [r.device_len for r in batch.reqs]
        self.cache_manager.allocate(batch.reqs)
        runs = [[token] for token in self.engine.forward_batch(batch, mask).tolist()]
        for req, run, start in zip(batch.reqs, runs, start_lens):
            self._keep(req, run, start)
        return runs, [1] * batch.size

    def check_integrity(self) -> None:
        self.drafter.check_integrity()

    def _k_for(self, req: Req) -> int:
        """k, less what max_tokens leaves: the run's last token is the target's own, so k + 1
        new tokens at most, and no position past the pages reserved for the request; 0 while
        the rule pauses its drafts."""
        if not self.rule.may_draft(req):
            return 0
        left = req.sampling_params.max_tokens - req.num_sampled
        return max(min(self.k, left - 1), 0)

    def _verify(
        self, reqs: Sequence[Req], drafts: Sequence[List[int]], logits: torch.Tensor
    ) -> List[List[int]]:
        """Each request's run: by the target's argmax (greedy), else by speculative
        sampling from the target's probabilities after temperature, top-k and top-p. All of
        it runs on the logits' device; the runs come back to the host in one copy."""
        args = BatchSamplingArgs.from_params([r.sampling_params for r in reqs], logits.device)
        # a seeded request's draws, from its seed and its step, as the sampler's
        args.row_seeds = [row_seed(r.sampling_params.seed, r.num_sampled) for r in reqs]
        runs, lengths = accept_batch(logits, drafts, args, self._generator)
        table = torch.cat([runs, lengths[:, None]], dim=1).tolist()  # the step's one copy back
        return [row[: row[-1]] for row in table]

    def _can_pad(self, reqs: Sequence[Req]) -> bool:
        """Whether every request can bring k drafts, so that the step replays a verify graph:
        there is one, and no request's k + 1 tokens would reach past its page-table row (a
        request at the model's context limit runs its step eagerly)."""
        if self.engine.verify_runner is None:
            return False
        width = self.engine.page_table.shape[1]
        return all(r.device_len + self.k <= width for r in reqs)

    def _allocate(self, reqs: Sequence[Req]) -> None:
        """Pages for the step's tokens, but none past a request's last position (``max_len -
        1``, all its reservation covers): the drafts of a request near max_tokens that pad
        its run to k are written to the dummy page (``Engine.prepare_batch``), and never
        kept."""
        device_lens = [r.device_len for r in reqs]
        for req in reqs:
            req.device_len = min(req.device_len, req.max_len - 1)
        self.cache_manager.allocate(list(reqs))
        for req, device_len in zip(reqs, device_lens):
            req.device_len = device_len

    def _keep(self, req: Req, run: List[int], start_len: int) -> None:
        """The request keeps ``run``: its K and V are valid through the last draft kept, the
        pages past that go back, and the run counts as sampled (the host appends it)."""
        held = min(req.cached_len, req.max_len - 1)  # the forward's, within the pages taken
        req.cached_len = start_len - 1 + len(run)  # its last token and the drafts kept
        req.device_len = req.cached_len + 1
        self.cache_manager.free_tail(req, held)
        self.drafter.accepted(req, req.cached_len)


def draft_model(config: SchedulerConfig, target: Engine) -> DraftModel:
    """The draft model in an engine of its own (its weights, its KV pool) with a page allocator
    of its own and no prefix cache, for requests as long as the target's."""
    draft_config = replace(
        config, model_path=str(config.draft_model), max_seq_len=target.max_seq_len
    )
    engine = Engine(draft_config)
    page_size = draft_config.page_size
    cache = CacheManager(
        engine.num_pages, page_size, engine.page_table, create_prefix_cache("naive", page_size)
    )
    return DraftModel(engine, cache, target.model_config.vocab_size, target.max_seq_len)


def _padded(req: Req, draft: List[int], k: int) -> List[int]:
    """The draft made k tokens long by repeating its last token (the request's, if it has
    none): a draft is only ever a guess, so any token will do, and repetition is a common one.
    The verify step then replays a CUDA graph instead of launching its kernels one by one."""
    last = draft[-1] if draft else req.all_ids[-1]
    return draft + [last] * (k - len(draft))
