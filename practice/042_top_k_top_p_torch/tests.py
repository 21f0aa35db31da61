import random
import sys

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
    got = solution.top_k_top_p_filter(
        probs, torch.tensor(ks, dtype=torch.int64), torch.tensor(ps, dtype=torch.float32)
    )
    assert isinstance(got, torch.Tensor), f"{what}: expected a tensor, got {type(got).__name__}"
    assert got.shape == probs.shape and got.dtype == probs.dtype, (
        f"{what}: expected shape {tuple(probs.shape)} {probs.dtype}, got {tuple(got.shape)} "
        f"{got.dtype}"
    )
    assert torch.equal(probs, before), f"{what}: the input tensor was changed"
    want = _model(rows, ks, ps)
    assert got.tolist() == want, (
        f"{what}: top_k={ks}, top_p={ps}\n got  {got.tolist()}\n want {want}"
    )


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
    _check(solution, [row], [-2], [1.0], "k=-2: any k <= 0 is no limit")
    _check(solution, [row], [-2], [0.6], "k=-2 with a top-p cut")


def test_rows_have_their_own_settings(solution):
    row = [0.5, 0.3125, 0.125, 0.0625]
    _check(solution, [row] * 4, [1, -1, 3, 2], [1.0, 0.7, 0.95, 0.4], "four rows, four settings")


def test_random_batch(solution):
    rng = random.Random(42)
    vocab = 10
    rows = [_distinct_row(rng, vocab) for _ in range(64)]
    ks = [rng.choice([-2, -1, 0, 1, 2, 4, 7, 50]) for _ in rows]
    ps = [rng.choice([1.0, 0.95, 0.5, 0.25, 0.8, 0.05]) for _ in rows]
    _check(solution, rows, ks, ps, "a random batch of 64 rows")


def test_top_p_one_is_no_limit_on_a_float32_softmax(solution):
    # a float32 cumsum over 32k tokens reaches 1.0 before the tail: p >= 1.0 must not cut
    gen = torch.Generator().manual_seed(4)
    probs = torch.softmax(torch.randn(2, 32000, generator=gen) * 3, dim=-1)
    got = solution.top_k_top_p_filter(
        probs.clone(), torch.tensor([-1, 100]), torch.tensor([1.0, 1.0])
    )
    want = probs.clone()
    want[1, probs[1].argsort(descending=True)[100:]] = 0.0
    zeroed = int(((got == 0) & (want != 0)).sum())
    assert torch.equal(got, want), (
        f"top_p=1.0 is no limit: {zeroed} tokens of a softmax over 32,000 were zeroed"
    )
    # exactly: 1.0 in ten tokens, then a tail of 2**-30 each that a float32 sum rounds away
    row = [2.0**-30] * 300
    for token, count in zip(range(3, 300, 29), [16, 12, 9, 8, 6, 5, 4, 2, 1, 1]):
        row[token] = count / 64
    _check(solution, [row, row], [-1, 0], [1.0, 1.0], "p=1.0 over a tail that sums away")


def _lines_run(solution, probs, top_k, top_p):
    """Events in the solution's own frames during one call: a call of one of its functions,
    lambdas, comprehensions or generators, and each line run there (a loop's every turn)."""
    events = 0

    def local(frame, event, arg):
        nonlocal events
        events += event == "line"
        return local

    def calls(frame, event, arg):
        nonlocal events
        if frame.f_code.co_filename != solution.__file__:
            return None  # torch's own Python code is not the learner's loop
        events += 1
        return local

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        solution.top_k_top_p_filter(probs, top_k, top_p)
    finally:
        sys.settrace(previous)
    return events


def test_no_python_loop(solution):
    # The code run in the solution's own frames must not grow with the batch or the
    # vocabulary: counted by a tracer, not timed, so a slow machine cannot fail it.
    gen = torch.Generator().manual_seed(42)
    settings = ([-1, 3, 0, 1], [1.0, 0.5, 0.9, 0.3])

    def lines(batch, vocab):
        probs = torch.softmax(torch.randn(batch, vocab, generator=gen), dim=-1)
        repeat = batch // len(settings[0])
        return _lines_run(
            solution,
            probs,
            torch.tensor(settings[0] * repeat),
            torch.tensor(settings[1] * repeat, dtype=torch.float32),
        )

    small, more_rows, more_tokens = lines(4, 16), lines(256, 16), lines(4, 1024)
    assert max(more_rows, more_tokens) <= small + 8, (
        f"a call ran {small} lines of your code for 4 rows of 16 tokens, {more_rows} for 256 "
        f"rows, {more_tokens} for 1024 tokens: a Python loop over rows or tokens (a for, a "
        "comprehension, map with a lambda); do it with tensor operations on the whole batch"
    )
