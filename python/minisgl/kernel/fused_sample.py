"""Sampling a batch's next tokens in two Triton kernels, by the exponential race.

A row that samples at temperature T takes ``argmax_i(logits_i / T - log(E_i))`` with E_i ~ Exp(1)
drawn afresh for each token i: token i wins with probability softmax(logits / T)_i, so there is no
softmax to compute, no normalization and no cumulative sum, only one pass over the logits. A
greedy row takes ``argmax_i(logits_i)``, in the same pass. The noise comes from Philox, a counter
based generator: E_i is a function of the row's seed and of i alone, so a row with a seed draws
the same token in any batch, at any position, beside any neighbours.

Rows with top-k or top-p still take chapter 4's torch filter (a sort of their probabilities); the
race then runs over the log of what the filter kept. Stage 1 splits each row into blocks of
``BLOCK_V`` tokens, one program each, and stage 2 picks each row's winner among its blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.engine.sample import BatchSamplingArgs, Sampler, top_k_top_p_filter

BLOCK_V = 4096  # tokens a stage-1 program races: 38 blocks a row at a vocabulary of 151,936


@triton.jit
def _uniforms(seed, start, BLOCK: tl.constexpr):
    """BLOCK floats strictly inside (0, 1) for tokens start .. start + BLOCK - 1 (start a multiple
    of 4). Token t gets output t % 4 of Philox's call at counter t // 4: a quarter of the calls
    (ten rounds of multiplies each) of one call a token, and still a function of (seed, t)."""
    r0, r1, r2, r3 = tl.randint4x(seed, start // 4 + tl.arange(0, BLOCK // 4))
    bits = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (BLOCK,))  # r0[q] at 4q, ...
    return _unit_float(bits)


@triton.jit
def _unit_float(bits):
    """32 random bits -> their top 23, centred in their step: u in [2^-24, 1 - 2^-24], every
    value exact in float32, so -log(u) is finite and > 0. (With 24 bits the top value,
    16,777,215.5, rounds up to 2^24 in float32, and u to exactly 1.)"""
    return ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)


@triton.jit
def _race_blocks_kernel(
    logits, temperatures, greedy, seeds, best_score, best_index, stride_row, vocab,
    BLOCK: tl.constexpr,
):
    """Program (row, block): the best score of tokens [block * BLOCK, (block + 1) * BLOCK) of
    the row, and its token, into best_score[row, block] and best_index[row, block]."""
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    x = tl.load(logits + row.to(tl.int64) * stride_row + cols, mask=mask, other=float("-inf"))
    score = x.to(tl.float32)
    if tl.load(greedy + row) == 0:
        exp1 = -tl.log(_uniforms(tl.load(seeds + row), block * BLOCK, BLOCK))  # E ~ Exp(1)
        score = score / tl.load(temperatures + row) - tl.log(exp1)
    i = tl.argmax(score, axis=0)  # the first of equal scores, as torch.argmax takes
    num_blocks = tl.num_programs(1)
    tl.store(best_score + row * num_blocks + block, tl.max(score, axis=0))
    tl.store(best_index + row * num_blocks + block, block * BLOCK + i)


@triton.jit
def _pick_winner_kernel(best_score, best_index, out, num_blocks, BLOCK: tl.constexpr):
    """Program row: the token of the row's best block score (the first block of equal ones)."""
    row = tl.program_id(0)
    blocks = tl.arange(0, BLOCK)
    scores = tl.load(best_score + row * num_blocks + blocks, mask=blocks < num_blocks,
                     other=float("-inf"))
    winner = tl.argmax(scores, axis=0)
    tl.store(out + row, tl.load(best_index + row * num_blocks + winner).to(tl.int64))


def race_sample(logits: torch.Tensor, temperatures: torch.Tensor, greedy: torch.Tensor,
                seeds: torch.Tensor) -> torch.Tensor:
    """One token per row: argmax of logits on greedy rows, else a draw from softmax(logits / T).

    logits: [B, V] (any float dtype, rows contiguous); temperatures: [B] float32 (unused on
    greedy rows); greedy: [B] bool; seeds: [B] int64, each row's noise -> token ids [B] int64.
    """
    num_rows, vocab = logits.shape
    assert logits.stride(-1) == 1
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    block = min(BLOCK_V, max(16, triton.next_power_of_2(vocab)))  # 4 tokens a Philox call
    num_blocks = triton.cdiv(vocab, block)
    best_score = torch.empty(num_rows, num_blocks, dtype=torch.float32, device=logits.device)
    best_index = torch.empty(num_rows, num_blocks, dtype=torch.int32, device=logits.device)
    _race_blocks_kernel[(num_rows, num_blocks)](
        logits, temperatures, greedy, seeds, best_score, best_index, logits.stride(0), vocab,
        BLOCK=block, num_warps=8 if block >= 2048 else 4,
    )
    _pick_winner_kernel[(num_rows,)](best_score, best_index, out, num_blocks,
                                     BLOCK=triton.next_power_of_2(num_blocks), num_warps=1)
    return out


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
        own = torch.tensor([[0 if s is None else s for s in args.row_seeds],
                            [s is not None for s in args.row_seeds]], dtype=torch.int64,
                           pin_memory=self.device.type == "cuda").to(self.device, non_blocking=True)
        return torch.where(own[1].bool(), own[0], seeds)

    @staticmethod
    def _filtered(logits: torch.Tensor,
                  args: BatchSamplingArgs) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows with top-k or top-p through chapter 4's filter: their logits become the log
        of the kept probabilities (-inf where dropped) at temperature 1; the other rows stay."""
        rows = ((args.top_k > 0) | (args.top_p < 1.0)) & ~args.greedy
        rows = rows.nonzero().squeeze(1)  # waits for the device: only batches with a filter pay
        probs = torch.softmax(logits[rows].float() / args.temperatures[rows, None], dim=-1)
        kept = top_k_top_p_filter(probs, args.top_k[rows], args.top_p[rows])
        logits = logits.to(torch.float32, copy=True)  # the caller's logits stay as they were
        logits[rows] = kept.log()
        return logits, args.temperatures.index_fill(0, rows, 1.0)

