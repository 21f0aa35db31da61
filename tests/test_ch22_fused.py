"""Chapter 22: the fused kernels (residual add + RMSNorm, sampling by the exponential race)
against the torch formulas they replace.

On a CPU they run in Triton's interpreter on small shapes; on CUDA also at Qwen3-0.6B's shapes
(hidden 1024, batch 256, vocabulary 151,936).
"""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any, List

if not Path("/dev/nvidia0").exists():  # no GPU: interpret; it must be chosen before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from helpers import greedy, hf_greedy  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.engine.fused_sampler import FusedSampler  # noqa: E402
from minisgl.engine.sample import BatchSamplingArgs  # noqa: E402
from minisgl.kernel.fused_norm import add_rms_norm, rms_norm  # noqa: E402
from minisgl.kernel.fused_rope import qk_norm_rope  # noqa: E402
from minisgl.kernel.fused_sample import (  # noqa: E402
    BLOCK_V,
    _unit_float,
    race_sample,
)
from minisgl.layers.norm import RMSNormFused, add_then_rms_norm  # noqa: E402
from minisgl.layers.norm import rms_norm as torch_rms_norm  # noqa: E402
from minisgl.layers.rotary import RotaryEmbedding  # noqa: E402

CUDA = torch.cuda.is_available()
on_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
DEVICE = "cuda" if CUDA else "cpu"  # the small shapes run on the GPU too where there is one

# Rounding to bfloat16 or float16 can land one step away from torch's (Triton's interpreter
# truncates bfloat16; a GPU's rsqrt is not torch's): one step of the dtype for the sum, two for
# the normalized row, which is rounded twice. A wrong eps moves the small rows far more.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-10}


# ---- residual add + RMSNorm --------------------------------------------------------------------


def norm_inputs(rows: int, hidden: int, dtype: torch.dtype, device: str, seed: int):
    """x, residual, weight: rows of very different sizes, so that a wrong eps shows: in the
    rows scaled by 1e-3, mean(x^2) is about 1e-6, the size of eps itself."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.tensor([1.0, 1e-3, 30.0, 1e-3, 0.1])[torch.arange(rows) % 5, None]
    x = torch.randn(rows, hidden, generator=gen) * scale
    residual = torch.randn(rows, hidden, generator=gen) * scale
    weight = 1.0 + 0.5 * torch.randn(hidden, generator=gen)
    return (t.to(device, dtype) for t in (x, residual, weight))


def assert_close(ours: torch.Tensor, reference: torch.Tensor, steps: int) -> None:
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    rtol = steps * TOLERANCE[ours.dtype]
    torch.testing.assert_close(ours.float(), reference.float(), rtol=rtol, atol=1e-30)


def check_add_rms_norm(
    rows: int, hidden: int, dtype: torch.dtype, device: str, seed: int = 0, eps: float = 1e-6
) -> None:
    """Against ``RMSNormFused``'s torch formula: the sum within one step of the dtype, and the
    output within two of the torch norm of that sum (the kernel's own sum, so that a sum one
    step off does not add to the norm's steps)."""
    x, residual, weight = norm_inputs(rows, hidden, dtype, device, seed)
    want_residual = add_then_rms_norm(x, residual, weight, eps)[1]
    x_before = x.clone()
    out, new_residual = add_rms_norm(x, residual, weight, eps)
    assert new_residual.data_ptr() == residual.data_ptr()  # the sum went back in place
    assert_close(new_residual, want_residual, steps=1)
    want_out = add_then_rms_norm(new_residual, None, weight, eps)[0]
    assert_close(out, want_out, steps=2)
    if dtype == torch.float16:  # rounded as torch rounds (the interpreter too): where HF rounds
        assert (out != want_out).float().mean() < 0.01  # skipping one rounding moves 25 %
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, hidden", [(1, 8), (5, 300), (3, 128), (4, 100)])
def test_add_rms_norm_equals_the_torch_formula(rows, hidden, dtype):
    check_add_rms_norm(rows, hidden, dtype, DEVICE, seed=rows * hidden)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 96), (1, 257)])
def test_rms_norm_equals_the_torch_formula(shape, dtype):
    """Plain RMSNorm through the same kernel, on any leading shape (q/k norm: [T, heads, D])."""
    hidden = shape[-1]
    x, _, weight = norm_inputs(int(torch.tensor(shape[:-1]).prod()), hidden, dtype, DEVICE, 1)
    x = x.view(shape)
    assert_close(rms_norm(x, weight, 1e-6), torch_rms_norm(x, weight, 1e-6), steps=2)


def test_rms_norm_reads_strided_rows():
    """A view with rows further apart than their length (a slice of a wider tensor)."""
    x, _, weight = norm_inputs(4, 40, torch.float32, DEVICE, 2)
    wide = torch.cat([x, torch.full_like(x, float("nan"))], dim=1)[:, :40]
    assert_close(rms_norm(wide, weight, 1e-5), torch_rms_norm(x, weight, 1e-5), steps=2)


@on_cuda
@pytest.mark.parametrize("rows", [1, 256, 8192])
def test_add_rms_norm_at_qwen3_shapes(rows):
    check_add_rms_norm(rows, 1024, torch.bfloat16, "cuda")
    check_add_rms_norm(rows, 1024, torch.float32, "cuda")


@on_cuda
def test_qk_rms_norm_at_qwen3_shapes():
    x, _, weight = norm_inputs(256 * 24, 128, torch.bfloat16, "cuda", 3)
    x = x.view(256, 24, 128)
    assert_close(rms_norm(x, weight, 1e-6), torch_rms_norm(x, weight, 1e-6), steps=2)


# ---- q/k norm + rotary embedding in one kernel -------------------------------------------------


def qkv_views(
    num_tokens: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
    seed: int,
):
    """q, k, v cut from one qkv tensor as the decoder cuts the merged GEMM's output: [T, heads,
    D] views whose token stride is the whole qkv row. Every third token is scaled by 1e-3, so
    that its heads' mean square is about eps and a wrong eps shows."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [h * head_dim for h in (num_q_heads, num_kv_heads, num_kv_heads)]
    scale = torch.tensor([1.0, 3.0, 1e-3])[torch.arange(num_tokens) % 3, None]
    qkv = (torch.randn(num_tokens, sum(sizes), generator=gen) * scale).to(device, dtype)
    return tuple(t.unflatten(-1, (-1, head_dim)) for t in qkv.split(sizes, dim=-1))


def spread_positions(num_tokens: int, max_position: int, device: str) -> torch.Tensor:
    """The table's last row first, then steps of 37 around it: no two neighbours alike. A view
    of a longer buffer, as a CUDA graph's positions are, so a read past the end reads a row."""
    spread = torch.arange(num_tokens + 1, device=device) * 37 + max_position - 1
    return (spread % max_position)[:num_tokens]


def norm_weights(head_dim: int, dtype: torch.dtype, device: str) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(head_dim)
    return [(1.0 + 0.5 * torch.randn(head_dim, generator=gen)).to(device, dtype) for _ in range(2)]


def assert_rotated_close(ours: torch.Tensor, want: torch.Tensor, steps: float) -> None:
    """Within ``steps`` of the dtype at each pair's length. A rotation mixes dims i and i + D/2:
    a value rotated near 0 keeps the absolute error of its inputs, which are the size of the
    pair's length (sqrt(x_i^2 + x_{i+D/2}^2), the same before and after the rotation)."""
    assert ours.dtype == want.dtype and ours.shape == want.shape
    first, second = want.float().chunk(2, dim=-1)
    length = torch.cat([first.hypot(second)] * 2, dim=-1).clamp_min(1e-30)
    worst = float(((ours.float() - want.float()).abs() / length).max())
    assert worst <= steps * torch.finfo(ours.dtype).eps, f"{worst:.3g} off ({ours.dtype})"


def check_qk_norm_rope(
    num_tokens: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    with_norm: bool,
    device: str,
    steps: float,
    max_position: int = 64,
) -> float:
    """The kernel in place on views of one qkv tensor, against ``rms_norm`` and ``_rotate``
    (the torch path): q and k within ``steps``, their storage the same, v untouched. Returns
    the share of q's and k's values that are not torch's exactly."""
    with torch.device(device):
        rope = RotaryEmbedding(head_dim, max_position, 10000.0)
    seed = num_tokens * 1000 + num_q_heads * 10 + head_dim
    q, k, v = qkv_views(num_tokens, num_q_heads, num_kv_heads, head_dim, dtype, device, seed)
    positions = spread_positions(num_tokens, max_position, device)
    weights = norm_weights(head_dim, dtype, device) if with_norm else [None, None]
    want_q, want_k = q, k
    if with_norm:
        want_q, want_k = torch_rms_norm(q, weights[0], 1e-6), torch_rms_norm(k, weights[1], 1e-6)
    want_q, want_k = rope.forward(positions, want_q, want_k)
    v_before = v.clone()
    got_q, got_k = qk_norm_rope(positions, q, k, rope._cos_sin_cache, *weights, eps=1e-6)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()
    assert_rotated_close(q, want_q, steps)
    assert_rotated_close(k, want_k, steps)
    assert torch.equal(v, v_before)
    return float(torch.cat([(q != want_q).flatten(), (k != want_k).flatten()]).float().mean())


# Steps of the dtype at a pair's length (assert_rotated_close), without the q/k norms and with
# them. Without, the kernel computes torch's formula (float32 products, one rounding): float32
# and float16 are exact, and bfloat16 one step, as Triton's interpreter truncates it where torch
# rounds to nearest. With the norms, the kernel's sum of squares adds in another order than
# torch's mean (about two steps of float32 in a normed value, times sqrt(2) in the rotation),
# and the interpreter truncates bfloat16 at each of three roundings (norm, weight, rotation).
ROPE_STEPS = {
    False: {torch.float32: 0.0, torch.bfloat16: 1.0, torch.float16: 0.0},
    True: {torch.float32: 3.0, torch.bfloat16: 3.0, torch.float16: 1.0},
}


@pytest.mark.parametrize("with_norm", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [8, 80, 128])
@pytest.mark.parametrize("num_q_heads, num_kv_heads", [(2, 2), (6, 2), (16, 1)])
def test_qk_norm_rope_equals_the_torch_path(num_q_heads, num_kv_heads, head_dim, dtype, with_norm):
    """GQA 1, 3 and 16, head dims 8, 80 (half of it not a power of two) and 128, one token and
    five, with Qwen3's q/k norms and without. float16 is rounded as torch rounds it, the
    interpreter too: where torch rounds, so must the kernel (skipping one moves about a fifth
    of the values)."""
    for num_tokens in (1, 5):
        differ = check_qk_norm_rope(
            num_tokens,
            num_q_heads,
            num_kv_heads,
            head_dim,
            dtype,
            with_norm,
            DEVICE,
            ROPE_STEPS[with_norm][dtype],
        )
        if dtype == torch.float16:
            assert differ < 0.01, f"{differ:.1%} of the values differ from torch's"


# On a GPU both sides round to nearest: bfloat16 within one step, and nearly every value torch's
# (fewer than one in 1,000 not exactly); float32 as in the interpreter.
ROPE_STEPS_CUDA = {torch.float32: 3.0, torch.bfloat16: 1.0}


def check_qk_norm_rope_on_cuda(
    num_tokens: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    with_norm: bool,
    max_position: int = 64,
) -> None:
    """Without the q/k norms the kernel is torch's formula exactly, in either dtype."""
    steps = ROPE_STEPS_CUDA[dtype] if with_norm else 0.0
    differ = check_qk_norm_rope(
        num_tokens,
        num_q_heads,
        num_kv_heads,
        head_dim,
        dtype,
        with_norm,
        "cuda",
        steps,
        max_position,
    )
    if dtype == torch.bfloat16:
        assert differ < 1e-3, f"{differ:.2%} of the values differ from torch's"


@on_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_rope_at_qwen3_shapes(dtype):
    """Qwen3-0.6B: 16 q heads and 8 KV heads of 128, a decode batch of 256, its 40,960 rows."""
    check_qk_norm_rope_on_cuda(256, 16, 8, 128, dtype, True, max_position=40960)


@on_cuda
@pytest.mark.parametrize("head_dim", [8, 16, 32, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("num_q_heads, num_kv_heads", [(4, 4), (12, 4), (16, 1)])
def test_qk_norm_rope_head_dims_on_cuda(num_q_heads, num_kv_heads, head_dim):
    for dtype in (torch.float32, torch.bfloat16):
        for with_norm in (True, False):
            check_qk_norm_rope_on_cuda(37, num_q_heads, num_kv_heads, head_dim, dtype, with_norm)


# ---- sampling ----------------------------------------------------------------------------------


def batch_args(
    params: List[SamplingParams], seeds: List[int | None] | None = None, device: str = DEVICE
) -> BatchSamplingArgs:
    args = BatchSamplingArgs.from_params(params, device)
    args.row_seeds = seeds if seeds is not None else [None] * len(params)
    return args


def chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def sample_counts(
    sampler: FusedSampler, logits: torch.Tensor, params: SamplingParams, n: int
) -> torch.Tensor:
    """Counts of n draws from one row of logits repeated n times, each row unseeded."""
    args = batch_args([params] * n)
    tokens = sampler.sample(logits.to(DEVICE).expand(n, -1), args)
    return torch.bincount(tokens.cpu(), minlength=logits.shape[0]).double()


# Six tokens, n = 200 draws at T = 2: every expected count is 6.8 or more. With 5 degrees of
# freedom, a statistic above 25 has a chance below 2e-4; against the probabilities at T = 1 (the
# temperature ignored) the same draws score about 130 on average (standard deviation 23), and at
# T = 0.5 (multiplied by, not divided) over 9,000.
LOGITS = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])


def test_frequencies_follow_softmax_at_the_temperature():
    n, temperature = 200, 2.0
    counts = sample_counts(FusedSampler(DEVICE, seed=1), LOGITS, SamplingParams(temperature), n)
    probs = torch.softmax(LOGITS.double() / temperature, -1)
    assert chi_square(counts, n * probs) < 25.0
    for wrong in (0.5, 1.0):  # the bound tells a wrong temperature apart
        assert chi_square(counts, n * torch.softmax(LOGITS.double() / wrong, -1)) > 40.0


def test_frequencies_follow_the_top_p_filter():
    """top_p = 0.8 at T = 1 keeps the two most likely tokens (63 % and 23 % of the mass)."""
    n = 120
    params = SamplingParams(temperature=1.0, top_p=0.8)
    counts = sample_counts(FusedSampler(DEVICE, seed=2), LOGITS, params, n)
    probs = torch.softmax(LOGITS.double(), -1)
    kept = torch.tensor([True, True, False, False, False, False])
    assert counts[~kept].sum() == 0
    assert chi_square(counts, n * torch.where(kept, probs, 0.0) / probs[kept].sum()) < 15.0


def test_a_filter_that_drops_nothing_draws_as_no_filter():
    """top_k = V keeps every token but takes the filter's path: the race over the log of the
    probabilities at T = 1 must give the tokens of the race over logits / T, seed for seed."""
    logits, seeds = flat_logits(6, 300, DEVICE) * 10.0, list(range(100, 106))
    plain = batch_args([SamplingParams(temperature=0.5)] * 6, seeds)
    kept_all = batch_args([SamplingParams(temperature=0.5, top_k=300)] * 6, seeds)
    tokens = FusedSampler(DEVICE).sample(logits, plain)
    assert torch.equal(FusedSampler(DEVICE).sample(logits, kept_all), tokens)
    assert not torch.equal(tokens, logits.argmax(-1))  # they did sample


def test_every_block_of_a_row_races_with_its_own_noise():
    """A row whose two blocks of BLOCK_V tokens hold the same logits: each half wins about half
    of the draws (out of 32: 8 to 24, a chance of 0.2 % to fall outside), and its tokens are
    the row's own (a block's winner is not numbered from the block's start)."""
    n, half = 32, flat_logits(1, BLOCK_V, DEVICE)
    logits = torch.cat([half, half], dim=1).expand(n, -1)
    tokens = FusedSampler(DEVICE, seed=5).sample(logits, batch_args([SamplingParams(1.0)] * n))
    assert 8 <= int((tokens >= BLOCK_V).sum()) <= 24


@on_cuda
@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(0.7, -1, 1.0), (1.3, 4, 1.0), (1.0, -1, 0.9)]
)
def test_frequencies_on_cuda(temperature, top_k, top_p):
    """The same at n = 100,000 draws, beside chapter 4's reference filter."""
    from test_ch04_sampling import reference_keep

    n, logits = 100_000, torch.tensor([2.0, 1.5, 1.2, 1.0, 0.7, 0.5, 0.2, 0.0, -0.5, -1.0])
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    counts = sample_counts(FusedSampler("cuda", seed=4), logits, params, n)
    probs = torch.softmax(logits.double() / temperature, -1)
    keep = torch.tensor(reference_keep(probs.tolist(), top_k, top_p))
    assert counts[~keep].sum() == 0
    assert chi_square(counts, n * torch.where(keep, probs, 0.0) / probs[keep].sum()) < 35.0
    assert chi_square(counts, n * torch.softmax(logits.double(), -1)) > 200.0


def mixed_params(num_rows: int) -> List[SamplingParams]:
    """Greedy rows among sampled ones, some with top-k or top-p, greedy ones too."""
    kinds = [
        SamplingParams(),
        SamplingParams(temperature=0.9),
        SamplingParams(top_k=3),
        SamplingParams(temperature=1.2, top_p=0.9),
        SamplingParams(temperature=0.6),
    ]
    return [kinds[row % len(kinds)] for row in range(num_rows)]


def check_greedy_rows(num_rows: int, vocab: int, dtype: torch.dtype, device: str) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(num_rows, vocab, generator=gen)
    logits[0, [vocab // 3, vocab - 1]] = logits[0].max() + 1.0  # a tie: the first one wins
    logits = logits.to(device, dtype)
    params = mixed_params(num_rows)
    tokens = FusedSampler(device, seed=0).sample(logits, batch_args(params, device=device))
    greedy = torch.tensor([p.is_greedy for p in params], device=device)
    assert tokens.dtype == torch.int64 and tokens.shape == (num_rows,)
    assert torch.equal(tokens[greedy], logits.argmax(-1)[greedy])
    assert tokens[0] == vocab // 3
    assert ((tokens >= 0) & (tokens < vocab)).all()


@pytest.mark.parametrize("num_rows, vocab", [(1, 7), (5, 300), (3, 5000)])
def test_greedy_rows_take_the_argmax(num_rows, vocab):
    check_greedy_rows(num_rows, vocab, torch.float32, DEVICE)


def flat_logits(num_rows: int, vocab: int, device: str) -> torch.Tensor:
    """Near-uniform rows: any change to a row's noise changes its token, almost surely."""
    return (0.1 * torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(7))).to(
        device
    )


def check_seeded_rows_repeat(num_rows: int, vocab: int, device: str) -> None:
    """Seeded rows draw the same tokens in another order, beside other rows, from a sampler of
    another seed; the unseeded rows of the batch draw apart from one another."""
    logits = flat_logits(num_rows, vocab, device)
    params = [SamplingParams(temperature=1.0)] * num_rows
    seeds: List[int | None] = [row * 7919 if row % 2 else None for row in range(num_rows)]
    first = FusedSampler(device, seed=0).sample(logits, batch_args(params, seeds, device))
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(1)).tolist()
    shuffled = FusedSampler(device, seed=1).sample(
        logits[order], batch_args(params, [seeds[i] for i in order], device)
    )
    again = torch.empty_like(shuffled).scatter_(0, torch.tensor(order, device=device), shuffled)
    seeded = torch.tensor([s is not None for s in seeds], device=device)
    assert torch.equal(again[seeded], first[seeded])
    assert not torch.equal(again[~seeded], first[~seeded])  # the unseeded draw afresh
    same_logits = logits[:1].expand(num_rows, -1)  # every row alike: only the noise differs
    tokens = FusedSampler(device, seed=0).sample(same_logits, batch_args(params, None, device))
    assert len(set(tokens.tolist())) > num_rows // 2


def test_seeded_rows_repeat_in_any_batch_order():
    check_seeded_rows_repeat(6, 300, DEVICE)


def check_seed_moves_no_neighbour(num_rows: int, vocab: int, device: str) -> None:
    """The same sampler seed and batch, but one row given a seed: the other rows' tokens stay."""
    logits = flat_logits(num_rows, vocab, device)
    params = [SamplingParams(temperature=1.0)] * num_rows
    unseeded: List[int | None] = [None] * num_rows
    one_seeded = list(unseeded)
    one_seeded[1] = 12345
    before = FusedSampler(device, seed=3).sample(logits, batch_args(params, unseeded, device))
    after = FusedSampler(device, seed=3).sample(logits, batch_args(params, one_seeded, device))
    others = torch.arange(num_rows, device=device) != 1
    assert torch.equal(after[others], before[others])
    assert after[1] != before[1]  # the seed did change its own row's draw


def test_a_seeded_row_leaves_its_neighbours_draws():
    check_seed_moves_no_neighbour(5, 300, DEVICE)


def test_same_sampler_seed_same_draws_and_the_generator_moves_on():
    logits = flat_logits(3, 200, DEVICE)
    args = batch_args([SamplingParams(temperature=1.0)] * 3)
    a, b, c = FusedSampler(DEVICE, seed=7), FusedSampler(DEVICE, seed=7), FusedSampler(DEVICE, 8)
    draws_a = [a.sample(logits, args) for _ in range(2)]
    assert all(torch.equal(x, b.sample(logits, args)) for x in draws_a)
    assert not torch.equal(draws_a[0], draws_a[1])
    assert not all(torch.equal(x, c.sample(logits, args)) for x in draws_a)


def test_race_sample_leaves_its_inputs():
    logits = flat_logits(4, 50, DEVICE)
    args = batch_args([SamplingParams(temperature=0.8, top_k=5)] * 4)
    before = logits.clone()
    FusedSampler(DEVICE).sample(logits, args)
    assert torch.equal(logits, before)
    greedy = torch.ones(4, dtype=torch.bool, device=DEVICE)
    seeds = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    assert torch.equal(race_sample(logits, args.temperatures, greedy, seeds), logits.argmax(-1))


@on_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampling_at_qwen3_shapes(dtype):
    check_greedy_rows(256, 151_936, dtype, "cuda")
    check_seeded_rows_repeat(256, 151_936, "cuda")
    check_seed_moves_no_neighbour(256, 151_936, "cuda")


# ---- wired in: the decoder's norms and the engine's sampler, on CUDA only -----------------------

DENSE = ["llama3", "qwen2", "qwen3", "mistral", "qwen2bytes"]
PROMPTS = [[3, 1, 4, 1, 5], [2, 7, 1, 8], list(range(30, 45)), [6] * 9, [9, 9], [5, 4, 3]]


def tiny_llm(path: Path, device: str) -> Any:
    from minisgl.llm import LLM

    return LLM(str(path), device=device, page_size=4, num_pages=128, max_running_req=8)


def test_on_a_cpu_the_torch_path_stays(tiny_models, monkeypatch):
    """A CPU engine keeps chapter 4's sampler and torch's q/k norms and rotary embedding, and
    the decoder's norm returns a new sum (the kernel would write it into ``residual``): every
    earlier chapter's prints stay as they were."""
    from minisgl.engine.sample import Sampler

    rope = CountedCalls(monkeypatch, "fused_rope", "qk_norm_rope")
    llm = tiny_llm(tiny_models["qwen3"], "cpu")
    assert type(llm.scheduler.engine.sampler) is Sampler
    assert len(llm.generate(PROMPTS[:1], [greedy(2)])[0]["token_ids"]) == 2
    assert rope.calls == 0
    x, residual, weight = norm_inputs(3, 16, torch.float32, "cpu", 4)
    norm = RMSNormFused(16)
    norm.weight = weight
    out, new_residual = norm.forward(x, residual)
    assert new_residual.data_ptr() != residual.data_ptr()
    assert torch.equal(out, add_then_rms_norm(x, residual, weight, 1e-6)[0])


class CountedCalls:
    """Counts the calls to a chapter-22 kernel's function (the decoder imports it when it runs):
    ``fused_norm.add_rms_norm`` or ``fused_rope.qk_norm_rope``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> None:
        import importlib

        kernels = importlib.import_module(f"minisgl.kernel.{module}")
        self.calls, real = 0, getattr(kernels, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(kernels, name, counted)


@on_cuda
@pytest.mark.parametrize("family", DENSE)
def test_fused_engine_gives_transformers_greedy_tokens(tiny_models, family, monkeypatch):
    """float32 on the GPU with the fused kernels wired in (CUDA graphs on): every dense tiny
    family's greedy tokens equal transformers'; the decoder went through the fused norm and
    the fused q/k norm + rotary (Qwen3 with its q/k norms, the others rotary alone)."""

    norm = CountedCalls(monkeypatch, "fused_norm", "add_rms_norm")
    rope = CountedCalls(monkeypatch, "fused_rope", "qk_norm_rope")
    llm = tiny_llm(tiny_models[family], "cuda")
    assert isinstance(llm.scheduler.engine.sampler, FusedSampler)
    assert llm.scheduler.engine.graph_runner.graphs
    ours = [out["token_ids"] for out in llm.generate(PROMPTS, [greedy(12)] * len(PROMPTS))]
    assert norm.calls > 0 and rope.calls > 0
    assert ours == hf_greedy(tiny_models[family], PROMPTS, 12)


@on_cuda
def test_the_switch_turns_the_fused_kernels_off(tiny_models, monkeypatch):
    """``MINISGL_DISABLE_FUSED_KERNELS=1``: torch's sampler, norms and rotary on the GPU, the
    same greedy tokens; seeded draws of either sampler repeat when the batch around them
    changes."""
    from minisgl.engine.sample import Sampler

    def run(prompts: List[List[int]], params: List[SamplingParams]) -> List[List[int]]:
        llm = tiny_llm(tiny_models["qwen3"], "cuda")
        return [out["token_ids"] for out in llm.generate(prompts, params)]

    norm = CountedCalls(monkeypatch, "fused_norm", "add_rms_norm")
    rope = CountedCalls(monkeypatch, "fused_rope", "qk_norm_rope")
    fused = run(PROMPTS, [greedy(12)] * len(PROMPTS))
    seeded = SamplingParams(temperature=0.9, max_tokens=10, ignore_eos=True, seed=5)
    alone = run(PROMPTS[:1], [seeded])
    beside = run(PROMPTS, [seeded] + [SamplingParams(temperature=0.9, max_tokens=10)] * 5)
    assert beside[0] == alone[0]
    monkeypatch.setenv("MINISGL_DISABLE_FUSED_KERNELS", "1")
    calls = norm.calls, rope.calls
    llm = tiny_llm(tiny_models["qwen3"], "cuda")
    assert type(llm.scheduler.engine.sampler) is Sampler
    plain = [out["token_ids"] for out in llm.generate(PROMPTS, [greedy(12)] * len(PROMPTS))]
    assert (norm.calls, rope.calls) == calls and plain == fused


# ---- the attention backend's length rows: 16-byte aligned at any batch size ---------------------


@pytest.mark.parametrize("graphs", [False, True])
def test_triton_backend_lengths_start_16_byte_aligned_at_any_batch_size(
    tiny_models, graphs: bool
) -> None:
    """Triton compiles a kernel anew for a pointer argument that is not 16-byte aligned: every
    length tensor a batch of 1 to 7 requests gets starts aligned, holds the batch's values, and
    the decode batches' share the graph buffers."""
    from minisgl.attention import create_attention_backend
    from minisgl.core import Batch, Req, SamplingParams
    from minisgl.models.config import ModelConfig
    from minisgl.utils.hf import read_hf_config

    config = ModelConfig.from_dict(read_hf_config(tiny_models["llama3"]))
    backend = create_attention_backend("triton", config, "cpu")
    if graphs:
        backend.init_graph_buffers(7)
    for size in range(1, 8):
        for phase in ("prefill", "decode"):
            reqs = [Req(i, [1] * (i + 2), SamplingParams(), table_idx=i) for i in range(size)]
            if phase == "decode":
                for r in reqs:
                    r.complete_forward()
                    r.append(7)
            batch = Batch(reqs, phase)
            backend.prepare_metadata(batch)
            meta = batch.attn_metadata
            lens = [meta.rows, meta.cached_lens, meta.extend_lens, meta.seq_lens, meta.q_starts]
            assert [t.data_ptr() % 16 for t in lens] == [0] * 5, (size, phase)
            assert meta.seq_lens.tolist() == [r.device_len for r in reqs]
            assert meta.extend_lens.tolist() == [r.extend_len for r in reqs]
            buffers = backend._graph_lens
            shared = buffers is not None and meta.rows.data_ptr() == buffers[0].data_ptr()
            assert shared == (graphs and phase == "decode")


# ---- the page table: a step's pages in one scatter ---------------------------------------------


def test_a_steps_pages_land_where_a_request_by_request_loop_puts_them():
    """``allocate`` takes a whole step's pages at once and writes them with one scatter; the page
    table must hold what the literal loop writes: request by request, page by page, the free
    queue's next page. Some requests cross a page boundary and some do not, and the queue wraps
    around the ring's end."""
    from minisgl.core import Req
    from minisgl.kvcache import create_prefix_cache
    from minisgl.scheduler.cache import CacheManager

    size, num_pages = 4, 11
    table = torch.full((6, 32), -1, dtype=torch.int32)
    cache = CacheManager(num_pages, size, table, create_prefix_cache("naive", size))
    first = Req(0, list(range(8 * size)), SamplingParams(max_tokens=1), table_idx=5)
    first.cache_handle = cache.match_req(first)
    cache.allocate([first])  # pages 0-7, given back: the queue is now 8, 9, 10, 0, 1, ...
    first.complete_forward()
    cache.cache_req(first, finished=True)
    queue = collections.deque([8, 9, 10, *range(8)])
    table.fill_(-1)
    # (row, cached_len, device_len): a prefill of two pages, decodes across a boundary and not,
    # a chunk that starts mid-page and crosses two
    spans = [(0, 0, 6), (1, 8, 9), (2, 5, 6), (3, 3, 4), (4, 12, 13), (5, 6, 17)]
    reqs = [
        Req(i, list(range(end)), SamplingParams(max_tokens=1), table_idx=row, cached_len=start)
        for i, (row, start, end) in enumerate(spans)
    ]
    expected = [[-1] * 32 for _ in range(6)]
    for row, start, end in spans:  # the literal loop
        for page_index in range(-(-start // size), -(-end // size)):
            page = queue.popleft()
            for j in range(size):
                expected[row][page_index * size + j] = page * size + j
    cache.allocate(reqs)
    assert table.tolist() == expected
    assert cache.num_free_pages == len(queue) == num_pages - 7
    assert cache._free_page_list().tolist() == list(queue)


def test_a_steps_allocation_runs_as_many_tensor_operations_for_2_requests_as_for_40():
    """The device work of ``allocate`` does not grow with the requests that cross a page
    boundary: counted by torch's profiler, 40 such requests run the operations 2 do."""
    from minisgl.core import Req
    from minisgl.kvcache import create_prefix_cache
    from minisgl.scheduler.cache import CacheManager

    def operations(crossing: int) -> int:
        size = 4
        table = torch.zeros(41, 16, dtype=torch.int32)
        cache = CacheManager(200, size, table, create_prefix_cache("naive", size))
        reqs = [
            Req(i, list(range(5)), SamplingParams(max_tokens=1), table_idx=i, cached_len=4)
            for i in range(crossing)
        ]  # position 4 starts their second page
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            cache.allocate(reqs)
        assert cache.num_free_pages == 200 - crossing
        return sum(1 for e in prof.events() if e.name.startswith("aten::"))

    assert operations(40) == operations(2)


@triton.jit
def _unit_floats_kernel(bits_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, _unit_float(tl.load(bits_ptr + offs).to(tl.uint32)))


def test_the_race_uniforms_stay_strictly_inside_0_1():
    """Philox's bits -> u: the extremes (all zeros, all ones) and a few between land strictly
    inside (0, 1), each exactly at its step's centre. With 24 bits, all ones gave u = 1 in
    float32, a token that wins whatever its probability (one in 2^24 of a row's tokens)."""
    values = [0, 1, 511, 512, 2**31, 2**32 - 513, 2**32 - 512, 2**32 - 1]
    bits = torch.tensor(values, dtype=torch.int64, device=DEVICE)
    out = torch.empty(len(values), dtype=torch.float32, device=DEVICE)
    _unit_floats_kernel[(1,)](bits, out, N=len(values))
    want = [((v >> 9) + 0.5) / 2**23 for v in values]
    assert out.double().tolist() == want
    assert 0.0 < out.min().item() and out.max().item() < 1.0
    assert out[-1].item() == 1.0 - 2**-24
