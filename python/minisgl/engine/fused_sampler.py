"""engine/sample.py's sampler with its draw done by the race kernel (kernel/fused_sample.py).

Rows with top-k or top-p still take the torch filter (a sort of their probabilities); the
race then runs over the log of what the filter kept.
"""

from __future__ import annotations

import torch

from minisgl.kernel.fused_sample import race_sample

from .sample import BatchSamplingArgs, Sampler, top_k_top_p_filter


class FusedSampler(Sampler):
    """``Sampler`` with the draw done by ``race_sample``: the same API, settings and seeding
    rules (a fixed seed gives fixed draws; a request's own seed, its own draws). The tokens drawn
    differ from ``Sampler``'s: the random numbers and the way they are used are not the same."""

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logits: [B, V] -> token ids [B] (int64)."""
        if args.all_greedy:  # torch's argmax is faster here: 69 against 88 us (bench_fused.py)
            return logits.argmax(dim=-1)
        temperatures = args.temperatures
        if args.any_filter:
            logits, temperatures = self._filtered(logits, args)
        return race_sample(logits, temperatures, args.greedy, self._row_seeds(args))

    def _row_seeds(self, args: BatchSamplingArgs) -> torch.Tensor:
        """[B] int64: every row's seed from the sampler's generator, then each request's own
        seed over its row. Every row draws, seeded or not, so a seed moves no neighbour's draw."""
        num_rows = args.greedy.shape[0]
        seeds = torch.randint(2**62, (num_rows,), generator=self._generator, device=self.device)
        if all(seed is None for seed in args.row_seeds):
            return seeds
        # one copy from pinned memory, which does not wait for the forward queued before it
        own = torch.tensor(
            [
                [0 if s is None else s for s in args.row_seeds],
                [s is not None for s in args.row_seeds],
            ],
            dtype=torch.int64,
            pin_memory=self.device.type == "cuda",
        ).to(self.device, non_blocking=True)
        return torch.where(own[1].bool(), own[0], seeds)

    @staticmethod
    def _filtered(
        logits: torch.Tensor, args: BatchSamplingArgs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows with top-k or top-p through the torch filter: their logits become the log
        of the kept probabilities (-inf where dropped) at temperature 1; the other rows stay."""
        rows = ((args.top_k > 0) | (args.top_p < 1.0)) & ~args.greedy
        rows = rows.nonzero().squeeze(1)  # waits for the device: only batches with a filter pay
        probs = torch.softmax(logits[rows].float() / args.temperatures[rows, None], dim=-1)
        kept = top_k_top_p_filter(probs, args.top_k[rows], args.top_p[rows])
        logits = logits.to(torch.float32, copy=True)  # the caller's logits stay as they were
        logits[rows] = kept.log()
        return logits, args.temperatures.index_fill(0, rows, 1.0)
