"""Sampling a batch's next tokens in two Triton kernels, by the exponential race.

A row that samples at temperature T takes ``argmax_i(logits_i / T - log(E_i))`` with E_i ~ Exp(1)
drawn afresh for each token i: token i wins with probability softmax(logits / T)_i, so there is no
softmax to compute, no normalization and no cumulative sum, only one pass over the logits. A
greedy row takes ``argmax_i(logits_i)``, in the same pass. The noise comes from Philox, a counter
based generator: E_i is a function of the row's seed and of i alone, so a row with a seed draws
the same token in any batch, at any position, beside any neighbours.

Stage 1 splits each row into blocks of ``BLOCK_V`` tokens, one program each, and stage 2 picks
each row's winner among its blocks. ``engine/fused_sampler.py`` puts the race behind the
``Sampler`` of ``engine/sample.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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
    logits,
    temperatures,
    greedy,
    seeds,
    best_score,
    best_index,
    stride_row,
    vocab,
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
    scores = tl.load(
        best_score + row * num_blocks + blocks, mask=blocks < num_blocks, other=float("-inf")
    )
    winner = tl.argmax(scores, axis=0)
    tl.store(out + row, tl.load(best_index + row * num_blocks + winner).to(tl.int64))


def race_sample(
    logits: torch.Tensor, temperatures: torch.Tensor, greedy: torch.Tensor, seeds: torch.Tensor
) -> torch.Tensor:
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
        logits,
        temperatures,
        greedy,
        seeds,
        best_score,
        best_index,
        logits.stride(0),
        vocab,
        BLOCK=block,
        num_warps=8 if block >= 2048 else 4,
    )
    _pick_winner_kernel[(num_rows,)](
        best_score,
        best_index,
        out,
        num_blocks,
        BLOCK=triton.next_power_of_2(num_blocks),
        num_warps=1,
    )
    return out
