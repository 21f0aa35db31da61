import random

import torch


def _model(rows, ks, ps):
    out = []
    for row, k, p in zip(rows, ks, ps):
        ranked = sorted(range(len(row)), key=lambda t: -row[t])
        kept, before = set(), 0.0
        for i, t in enumerate(ranked):
            if (k <= 0 or i < k) and (p >= 1.0 or before < p):
                kept.add(t)
            before += row[t]
        out.append([v if t in kept else 0.0 for t, v in enumerate(row)])
    return out


def _distinct_row(rng, vocab):
    # distinct multiples of 1/64 summing to 1 (vocab <= 10): no ties, exact sums
    while True:
        cuts = sorted(rng.sample(range(1, 64), vocab - 1))
        counts = [b - a for a, b in zip([0] + cuts, cuts + [64])]
        if len(set(counts)) == vocab:
            return [c / 64 for c in counts]


def _check(solution, rows, ks, ps, what):
    probs = torch.tensor(rows, dtype=torch.float32)
    before = probs.clone()
    got = solution.top_k_top_p_filter(probs, torch.tensor(ks, dtype=torch.int64),
                                      torch.tensor(ps, dtype=torch.float32))
    assert isinstance(got, torch.Tensor), f"{what}: expected a tensor, got {type(got).__name__}"
    assert got.shape == probs.shape and got.dtype == probs.dtype, (
        f"{what}: expected shape {tuple(probs.shape)} {probs.dtype}, got {tuple(got.shape)} "
        f"{got.dtype}")
    assert torch.equal(probs, before), f"{what}: the input tensor was changed"
    want = _model(rows, ks, ps)
    assert got.tolist() == want, (
        f"{what}: top_k={ks}, top_p={ps}\n got  {got.tolist()}\n want {want}")


def test_top_p_mass_before(solution):
    row = [0.125, 0.5, 0.3125, 0.0625]
    _check(solution, [row], [-1], [0.6], "top-p 0.6")
    _check(solution, [row], [-1], [0.8125], "p equal to the mass before the third token")
    _check(solution, [row], [-1], [0.01], "p below the largest probability")


def test_top_k(solution):
    row = [0.125, 0.5, 0.3125, 0.0625]
    _check(solution, [row], [2], [1.0], "k=2")
    _check(solution, [row], [1], [1.0], "k=1")
    _check(solution, [row], [-1], [1.0], "no limit")
    _check(solution, [row], [0], [1.0], "k=0 is no limit")


def test_rows_have_their_own_settings(solution):
    row = [0.5, 0.3125, 0.125, 0.0625]
    _check(solution, [row] * 4, [1, -1, 3, 2], [1.0, 0.7, 0.95, 0.4], "four rows, four settings")


def test_random_batch(solution):
    rng = random.Random(42)
    vocab = 10
    rows = [_distinct_row(rng, vocab) for _ in range(64)]
    ks = [rng.choice([-1, 0, 1, 2, 4, 7, 50]) for _ in rows]
    ps = [rng.choice([1.0, 0.95, 0.5, 0.25, 0.8, 0.05]) for _ in rows]
    _check(solution, rows, ks, ps, "a random batch of 64 rows")
