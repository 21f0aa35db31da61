"""Sampling the next token of every row of a batch, each row with its own settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

import torch

from minisgl.core import Batch, SamplingParams


@dataclass
class BatchSamplingArgs:
    """The sampling settings of a batch's rows as tensors, one entry per row: [B] each."""

    temperatures: torch.Tensor  # float32; 1.0 on greedy rows (their draw is not used)
    top_k: torch.Tensor  # int64; -1: no limit
    top_p: torch.Tensor  # float32
    greedy: torch.Tensor  # bool
    all_greedy: bool  # no row samples: skip the softmax and the draw
    any_filter: bool = True  # some row has top-k or top-p: sort the probabilities
    row_seeds: List[int | None] = field(default_factory=list)  # per row: its own draw's seed

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], device: str | torch.device = "cpu"
    ) -> BatchSamplingArgs:
        greedy = [p.is_greedy for p in params]
        temperatures = [1.0 if g else p.temperature for p, g in zip(params, greedy)]
        top_k, top_p = [p.top_k for p in params], [p.top_p for p in params]
        # one host-to-device copy, not four: each costs tens of microseconds on a GPU
        rows = torch.tensor([temperatures, top_k, top_p, greedy], dtype=torch.float64)
        rows = rows.to(device, non_blocking=True)
        return cls(
            temperatures=rows[0].float(),
            top_k=rows[1].long(),
            top_p=rows[2].float(),
            greedy=rows[3].bool(),
            all_greedy=all(greedy),
            any_filter=any(p.top_k > 0 or p.top_p < 1.0 for p in params),
        )


def top_k_top_p_filter(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Zero, row by row, the tokens that top-k or top-p leaves out (the rest not renormalized).

    probs: [B, V]; top_k, top_p: [B]. In the order of decreasing probability, token i is kept when
    ``i < k`` (``k = -1``: any i) and the tokens before it hold less than ``p`` in all (``p = 1``:
    any); so the most likely token is always kept.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    k = torch.where(top_k > 0, top_k, probs.shape[-1])[:, None]
    p = top_p[:, None]
    drop = (rank >= k) | ((mass_before >= p) & (p < 1.0))
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))


class Sampler:
    """Picks one token per row of the logits. Draws come from its own seeded generator, so the
    same seed and the same batches give the same tokens."""

    def __init__(self, device: str | torch.device = "cpu", seed: int = 0):
        self.device = torch.device(device)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        args = BatchSamplingArgs.from_params([r.sampling_params for r in batch.reqs], self.device)
        args.row_seeds = [row_seed(r.sampling_params.seed, len(r.output_ids)) for r in batch.reqs]
        return args

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logits: [B, V] -> token ids [B] (int64)."""
        greedy_ids = logits.argmax(dim=-1)
        if args.all_greedy:
            return greedy_ids
        probs = torch.softmax(logits.float() / args.temperatures[:, None], dim=-1)
        if args.any_filter:  # the sort of [B, V] costs more than the rest of sampling
            probs = top_k_top_p_filter(probs, args.top_k, args.top_p)
        drawn = torch.multinomial(probs, 1, generator=self._generator).squeeze(1)
        for row, seed in enumerate(args.row_seeds):
            if seed is not None:  # a request with a seed draws alone: the batch cannot change it
                own = torch.Generator(device=self.device).manual_seed(seed)
                drawn[row] = torch.multinomial(probs[row], 1, generator=own)[0]
        return torch.where(args.greedy, greedy_ids, drawn)


def row_seed(seed: int | None, step: int) -> int | None:
    """The seed of a request's draw at its ``step``-th new token, from its own seed and the
    step: a request repeats its tokens in any batch, and each step draws afresh. It stays in 32
    bits, since torch's CPU generator keeps only the low 32 bits of a seed."""
    return None if seed is None else (seed * 1_000_003 + step) % 2**32
