"""Chapter 4: SamplingParams and batched sampling (greedy, temperature, top-k, top-p per row,
seeded), held against literal per-row loops and frequency counts.

Req, Batch and Context grow fields in the chapters that follow (the KV cache, the scheduler), so
these tests, which must pass on every later tree, reach sampling through SamplingParams and
BatchSamplingArgs.from_params; only _seeded_run builds Reqs and a Batch, from the fields every
later tree keeps (uid, prompt, SamplingParams), and no test builds a Context."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import encode
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import SamplingParams
from minisgl.engine.sample import BatchSamplingArgs, Sampler, top_k_top_p_filter
from minisgl.models import generate_greedy_recompute, load_model, sequence_logits

# ---- SamplingParams -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.5),
        ("temperature", float("nan")),
        ("top_k", 0),
        ("top_k", -2),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("seed", -1),
        ("seed", 2**31),
    ],
)
def test_bad_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        SamplingParams(**{field: value})


def test_sampling_params_defaults_and_edges():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.ignore_eos) == (0.0, -1, 1.0, False)
    assert p.is_greedy
    edge = SamplingParams(temperature=2.0, top_k=1, top_p=1e-6, max_tokens=1)
    assert not edge.is_greedy


# ---- the filters against a literal loop -----------------------------------------------------


def reference_keep(probs: list[float], k: int, p: float) -> list[bool]:
    """Row by row, as the rule reads: most likely first; keep while rank < k and the mass before
    is below p."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    keep = [False] * len(probs)
    mass = 0.0
    for rank, i in enumerate(order):
        if (k == -1 or rank < k) and (p >= 1.0 or mass < p):
            keep[i] = True
        mass += probs[i]
    return keep


@settings(max_examples=30, deadline=None, derandomize=True)  # the same examples every run
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 12), vocab=st.integers(2, 60))
def test_filter_masks_equal_the_reference_loop(seed, rows, vocab):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(3 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64), -1)
    top_k = torch.randint(0, vocab + 2, (rows,), generator=gen)
    top_k[top_k == 0] = -1
    top_p = torch.rand(rows, generator=gen, dtype=torch.float64) * 1.05 + 0.01
    top_p = top_p.clamp(max=1.0)
    out = top_k_top_p_filter(probs, top_k, top_p)
    for r in range(rows):
        keep = reference_keep(probs[r].tolist(), int(top_k[r]), float(top_p[r]))
        assert (out[r] > 0).tolist() == keep
        assert torch.equal(out[r][out[r] > 0], probs[r][out[r] > 0])  # kept as they were


def test_filter_examples():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]] * 4)
    top_k, top_p = torch.tensor([2, -1, -1, 1]), torch.tensor([1.0, 0.5, 0.75, 1.0])
    out = top_k_top_p_filter(probs, top_k, top_p)
    assert (out > 0).tolist() == [
        [False, True, False, True],  # top-2: 0.4 and 0.3
        [False, True, False, True],  # top-p 0.5: 0.4 is not enough, 0.4 + 0.3 is
        [False, True, True, True],  # top-p 0.75: 0.4 + 0.3 = 0.7 < 0.75, so 0.2 too
        [False, True, False, False],  # top-1
    ]
    # exactly at the boundary: 0.5 + 0.25 reaches 0.75, so the set is complete without 0.125
    exact = torch.tensor([[0.125, 0.5, 0.125, 0.25]])
    out = top_k_top_p_filter(exact, torch.tensor([-1]), torch.tensor([0.75]))
    assert (out > 0).tolist() == [[False, True, False, True]]


# ---- the sampler ----------------------------------------------------------------------------


def _args(*params: SamplingParams) -> BatchSamplingArgs:
    return BatchSamplingArgs.from_params(params)


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 100)
    params = [
        SamplingParams(),
        SamplingParams(temperature=1.0),
        SamplingParams(),
        SamplingParams(temperature=0.7, top_k=1),
        SamplingParams(temperature=5.0, top_p=1e-6),
        SamplingParams(temperature=1.0, top_k=20),
    ]
    sampler = Sampler(seed=0)
    for _ in range(20):
        tokens = sampler.sample(logits, _args(*params))
        assert tokens.dtype == torch.int64 and tokens.shape == (6,)
        assert tokens[[0, 2, 3, 4]].tolist() == logits.argmax(-1)[[0, 2, 3, 4]].tolist()
    all_greedy = Sampler(seed=0).sample(logits, _args(*[SamplingParams()] * 6))
    assert torch.equal(all_greedy, logits.argmax(-1))


def test_same_seed_same_draws():
    torch.manual_seed(1)
    logits = torch.randn(32, 200)
    args = _args(*[SamplingParams(temperature=1.0, top_p=0.95)] * 32)
    a, b, c = Sampler(seed=7), Sampler(seed=7), Sampler(seed=8)
    draws_a = [a.sample(logits, args) for _ in range(5)]
    draws_b = [b.sample(logits, args) for _ in range(5)]
    draws_c = [c.sample(logits, args) for _ in range(5)]
    assert all(torch.equal(x, y) for x, y in zip(draws_a, draws_b))
    assert not all(torch.equal(x, y) for x, y in zip(draws_a, draws_c))
    assert not all(torch.equal(draws_a[0], x) for x in draws_a[1:])  # the generator moves on


def _chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [
        (1.0, -1, 1.0),
        (0.7, 5, 1.0),
        (1.3, -1, 0.8),
        (0.8, 6, 0.9),
    ],
)
def test_frequencies_follow_the_filtered_distribution(temperature, top_k, top_p):
    """Draw N tokens from one row of logits repeated N times; the counts must fit the filtered,
    renormalized distribution (chi-square; 9 degrees of freedom at most, p < 1e-4 beyond 35)."""
    n, logits = 40_000, torch.tensor([2.0, 1.5, 1.2, 1.0, 0.7, 0.5, 0.2, 0.0, -0.5, -1.0])
    args = _args(*[SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * n)
    tokens = Sampler(seed=3).sample(logits.expand(n, -1), args)
    counts = torch.bincount(tokens, minlength=10).double()

    probs = torch.softmax(logits.double() / temperature, -1)
    keep = torch.tensor(reference_keep(probs.tolist(), top_k, top_p))
    expected = n * torch.where(keep, probs, 0.0) / probs[keep].sum()
    assert counts[~keep].sum() == 0
    assert _chi_square(counts, expected) < 35.0
    # the same counts against a plain softmax (no temperature, no filter) fail by far, unless
    # this case is exactly that
    plain = n * torch.softmax(logits.double(), -1)
    if (temperature, top_k, top_p) != (1.0, -1, 1.0):
        assert _chi_square(counts, plain) > 200.0


def test_rows_of_one_batch_keep_their_own_settings():
    n, logits = 20_000, torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0])
    params = [SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=1.0, top_p=0.6)]
    args = _args(*params * n)
    tokens = Sampler(seed=5).sample(logits.expand(2 * n, -1), args).view(n, 2)
    for row, p in enumerate(params):
        counts = torch.bincount(tokens[:, row], minlength=5).double()
        probs = torch.softmax(logits.double(), -1)
        keep = torch.tensor(reference_keep(probs.tolist(), p.top_k, p.top_p))
        expected = n * torch.where(keep, probs, 0.0) / probs[keep].sum()
        assert counts[~keep].sum() == 0 and _chi_square(counts, expected) < 25.0
    assert math.isclose(
        float((tokens[:, 0] == 0).double().mean()), 1 / (1 + math.exp(-0.5)), abs_tol=0.02
    )


# ---- at the scale of a real vocabulary ------------------------------------------------------

QWEN_VOCAB = 151_936  # Qwen2's and Qwen3's vocabulary


def real_scale_logits(scale: float, multiplier: int = 7919) -> torch.Tensor:
    """[151936] float32 logits, all different, spread evenly over [0, scale): a permutation of
    0 .. V-1 (the multiplier is prime to V), scaled. Integer arithmetic and one multiply, so
    every platform computes the same values (torch.randn may not, across CPU kernels)."""
    ids = torch.arange(QWEN_VOCAB)
    return ((ids * multiplier) % QWEN_VOCAB).float() * (scale / QWEN_VOCAB)


@pytest.mark.parametrize("top_k", [-1, QWEN_VOCAB])
@pytest.mark.parametrize("scale", [1.0, 19.0])  # nearly flat (max/min = e); peaked (e^19)
def test_top_p_one_keeps_every_token_of_a_real_vocabulary(scale, top_k):
    """In float32 the probabilities of 151,936 tokens do not sum to exactly 1: with the peaked
    row the running sum passes 1.0 long before the end (57,347 tokens before it, with torch
    2.13), so a filter that applied "mass before < p" to p = 1.0 too would drop them all."""
    probs = torch.softmax(real_scale_logits(scale), -1).expand(2, -1)
    assert probs.dtype == torch.float32 and (probs > 0).all()
    out = top_k_top_p_filter(probs, torch.tensor([top_k, top_k]), torch.tensor([1.0, 1.0]))
    assert torch.equal(out, probs)


def test_seeded_draws_equal_the_recorded_tokens():
    """Not only "the same seed, the same tokens": these tokens, drawn once by this code from a
    real-size vocabulary and checked plausible below. A sampler that draws from a different
    distribution, or takes its random numbers differently, gives others. (torch's CPU generator
    and its exponential draws, on which multinomial rests, do not depend on the thread count.)"""
    multipliers = [7919, 104729, 1299709, 15485863]  # four different rows
    logits = torch.stack([real_scale_logits(12.0, m) for m in multipliers])
    params = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=20),
        SamplingParams(temperature=1.3, top_p=0.5),
        SamplingParams(),
    ]
    sampler = Sampler(seed=2024)
    draws = [sampler.sample(logits, _args(*params)).tolist() for _ in range(3)]
    assert draws == [
        [4873, 10296, 50083, 83945],
        [23177, 63411, 124035, 83945],
        [11741, 2887, 93015, 83945],
    ]
    # plausible: rank 0 is the most likely token of its row
    rank = logits.argsort(-1, descending=True).argsort(-1)
    ranks = [[int(rank[row, token]) for row, token in enumerate(d)] for d in draws]
    assert ranks == [[2456, 7, 6888, 0], [24, 4, 7944, 0], [7852, 16, 3844, 0]]
    probs = torch.softmax(logits[2] / 1.3, -1).sort(descending=True).values
    top_p_set = int((probs.cumsum(0) - probs < 0.5).sum())  # row 2 keeps its top 11,408
    assert all(r[2] < top_p_set for r in ranks) and all(r[1] < 20 for r in ranks)


# ---- with a model ---------------------------------------------------------------------------


def _generate(
    model, sampler: Sampler, prompts: list[list[int]], params: list[SamplingParams], steps: int
) -> list[list[int]]:
    """Recompute every sequence, take its last logits, sample the batch; the new tokens."""
    seqs = [list(p) for p in prompts]
    args = BatchSamplingArgs.from_params(params)
    for _ in range(steps):
        logits = torch.stack([sequence_logits(model, s)[-1] for s in seqs])
        for seq, token in zip(seqs, sampler.sample(logits, args).tolist()):
            seq.append(token)
    return [s[len(p) :] for s, p in zip(seqs, prompts)]


def test_greedy_sampling_equals_greedy_generation(tiny_models):
    path = tiny_models["qwen3"]
    model = load_model(path)
    prompts = [encode(path, p) for p in ["hello world", "The quick brown fox", "1 2 3"]]
    ours = _generate(model, Sampler(seed=0), prompts, [SamplingParams()] * 3, 12)
    assert ours == [generate_greedy_recompute(model, p, 12) for p in prompts]


def test_sampled_generation_is_reproducible(tiny_models):
    path = tiny_models["llama3"]
    model = load_model(path)
    ids = encode(path, "Once upon a time")

    def generate(seed: int) -> list[list[int]]:
        params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.9)] * 3
        return _generate(model, Sampler(seed=seed), [ids] * 3, params, 8)

    first = generate(11)
    assert generate(11) == first
    assert len({tuple(x) for x in first}) > 1  # three rows, different draws


def test_the_mains_rows_draw_what_the_text_quotes(tiny_models):
    """The main's three requests on the tiny Llama 3: the top-k row alone, second in a batch of
    two, and second of three (exercise 1: an unseeded row's draws depend on its batch), and the
    filtered mass at the steps where each sampled row leaves the greedy path."""
    path = tiny_models["llama3"]
    model = load_model(path)
    prompt = encode(path, "Once upon a time")
    greedy = SamplingParams(max_tokens=12)
    top_k = SamplingParams(temperature=0.8, top_k=20, max_tokens=12)
    top_p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12)

    def run(params: list[SamplingParams]) -> list[list[int]]:
        return _generate(model, Sampler(seed=0), [prompt] * len(params), params, 4)

    assert run([top_k]) == [[436, 269, 176, 174]]
    assert run([greedy, top_k])[1] == [315, 344, 7, 209]
    path_of_greedy, k_row, p_row = run([greedy, top_k, top_p])
    assert (k_row, p_row[:2]) == ([315, 413, 34, 420], [315, 239])

    def mass(done: list[int], params: SamplingParams) -> torch.Tensor:
        """The next token's probabilities after the row's temperature, top-k and top-p."""
        probs = torch.softmax(sequence_logits(model, prompt + done)[-1] / params.temperature, -1)
        kept = top_k_top_p_filter(
            probs[None], torch.tensor([params.top_k]), torch.tensor([params.top_p])
        )[0]
        return kept / kept.sum()

    at_4 = mass(path_of_greedy[:3], top_k)  # greedy's 4th token is 413, the row drew 420
    assert path_of_greedy[3] == 413 and (
        round(float(at_4[413]), 2),
        round(float(at_4[420]), 2),
    ) == (
        0.33,
        0.17,
    )
    at_2 = mass(path_of_greedy[:1], top_p)  # greedy's 2nd is 413, the row drew 239
    assert path_of_greedy[1] == 413 and round(float(at_2[413]), 2) == 0.38
    assert int((at_2 > 0).sum()) == 13


def test_the_default_seed_is_the_engine_default_seed():
    """``Sampler()`` draws as ``Sampler(seed=0)``, the seed EngineConfig gives by default."""
    torch.manual_seed(1)
    logits = torch.randn(32, 200)
    args = _args(*[SamplingParams(temperature=1.0)] * 32)
    default, zero, one = Sampler(), Sampler(seed=0), Sampler(seed=1)
    assert torch.equal(default.sample(logits, args), zero.sample(logits, args))
    assert not torch.equal(Sampler().sample(logits, args), one.sample(logits, args))


def _seeded_run(seed: int | None, sampler_seed: int, rows: int, where: int) -> list[int]:
    """30 steps of one request at row ``where`` of a batch of ``rows`` sampled requests."""
    from minisgl.core import Batch, Req

    logits = torch.randn(30, 64, generator=torch.Generator().manual_seed(0))
    req = Req(0, [1], SamplingParams(temperature=1.0, max_tokens=30, seed=seed))
    others = [
        Req(i + 1, [1], SamplingParams(temperature=1.0, max_tokens=30)) for i in range(rows - 1)
    ]
    reqs = others[:where] + [req] + others[where:]
    sampler = Sampler(seed=sampler_seed)
    for step in range(30):
        args = sampler.prepare(Batch(reqs))
        for r, token in zip(reqs, sampler.sample(logits[step].expand(len(reqs), -1), args)):
            r.append(int(token))
    return req.output_ids


def test_a_request_with_a_seed_draws_the_same_in_any_batch():
    """Its own seed makes a request's tokens independent of its batch, its row and the
    sampler's seed; each step draws afresh. Without one, the batch changes them."""
    alone = _seeded_run(42, sampler_seed=0, rows=1, where=0)
    assert _seeded_run(42, sampler_seed=5, rows=4, where=2) == alone
    assert _seeded_run(42, sampler_seed=9, rows=3, where=0) == alone
    assert len(set(alone)) > 10  # 30 draws over 64 flat-ish tokens: not one draw repeated
    assert _seeded_run(43, sampler_seed=0, rows=1, where=0) != alone
    unseeded = _seeded_run(None, sampler_seed=0, rows=1, where=0)
    assert _seeded_run(None, sampler_seed=0, rows=4, where=2) != unseeded


def _neighbour_run(neighbour_seed: int | None, steps: int = 12) -> tuple[list[int], list[int]]:
    """``steps`` draws of an unseeded request at row 0 beside a request at row 1 that carries
    ``neighbour_seed``, with the same sampler seed: the two requests' tokens."""
    from minisgl.core import Batch, Req

    logits = torch.randn(steps, 64, generator=torch.Generator().manual_seed(1))
    reqs = [
        Req(0, [1], SamplingParams(temperature=1.0, max_tokens=steps)),
        Req(1, [1], SamplingParams(temperature=1.0, max_tokens=steps, seed=neighbour_seed)),
    ]
    sampler = Sampler(seed=3)
    for step in range(steps):
        args = sampler.prepare(Batch(reqs))
        for r, token in zip(reqs, sampler.sample(logits[step].expand(2, -1), args)):
            r.append(int(token))
    return reqs[0].output_ids, reqs[1].output_ids


def test_a_seeded_neighbour_moves_no_draw_of_an_unseeded_request():
    """The unseeded rows draw from the sampler's generator, in one draw for the whole batch; a
    seeded row draws again from a generator of its own. So whether a neighbour carries a seed
    changes none of an unseeded request's tokens, at this step or any later one. (A seeded row
    that reseeded the sampler's own generator for its draw would pass every other test here:
    its own tokens stay right, and this step's unseeded draws are already made.)"""
    plain, plain_neighbour = _neighbour_run(None)
    beside_seeded, seeded_neighbour = _neighbour_run(7)
    assert beside_seeded == plain
    assert seeded_neighbour != plain_neighbour  # the seed did change the neighbour's draws
    assert len(set(plain)) > 4  # 12 draws over 64 flat-ish tokens, not one token repeated
