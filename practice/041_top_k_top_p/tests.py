import random


def _model(probs, top_k, top_p):
    out = []
    for row, k, p in zip(probs, top_k, top_p):
        ranked = sorted((-v, t) for t, v in enumerate(row))
        keep = set()
        before = 0.0
        for i, (neg, t) in enumerate(ranked):
            if (k <= 0 or i < k) and (p >= 1.0 or before < p):
                keep.add(t)
            before += -neg
        out.append([v if t in keep else 0.0 for t, v in enumerate(row)])
    return out


def _check(solution, probs, top_k, top_p, what):
    want = _model(probs, top_k, top_p)
    got = solution.top_k_top_p_filter([list(r) for r in probs], list(top_k), list(top_p))
    assert got == want, (
        f"{what}: top_k={top_k}, top_p={top_p}, probs={probs}\n got  {got}\n want {want}"
    )


def test_examples(solution):
    row = [0.125, 0.5, 0.25, 0.125]
    _check(solution, [row], [-1], [0.6], "top-p 0.6")
    _check(solution, [row], [3], [1.0], "top-k 3 with a tie")


def test_mass_before_not_including(solution):
    row = [0.125, 0.5, 0.25, 0.125]
    _check(solution, [row], [-1], [0.75], "p equal to the mass before the third token")
    _check(solution, [row], [-1], [0.5], "p equal to the first token's probability")
    _check(solution, [row], [-1], [0.0625], "p below the largest probability")


def test_no_limits(solution):
    row = [0.25, 0.25, 0.5]
    _check(solution, [row], [-1], [1.0], "k=-1, p=1: nothing removed")
    _check(solution, [row], [0], [1.0], "k=0 means no limit too")
    _check(solution, [row], [10], [1.0], "k larger than the vocabulary")
    _check(solution, [row], [-2], [1.0], "k=-2: any k <= 0 means no limit")
    _check(solution, [row], [-2], [0.5], "k=-2 with a top-p cut")


def _rounded_away_tail(vocab):
    """Tokens holding 1.0 in all, exactly, and a tail of 2**-60 each: a float sum of the ranked
    probabilities reaches 1.0 before the tail, as a softmax's does over a large vocabulary."""
    rng = random.Random(4096)
    head = [16, 12, 9, 8, 6, 5, 4, 2, 1, 1]  # 64ths
    row = [2.0**-60] * vocab
    for token, count in zip(rng.sample(range(vocab), len(head)), head):
        row[token] = count / 64
    return row


def test_top_p_one_is_no_limit_whatever_the_rounding(solution):
    row = _rounded_away_tail(32000)
    got = solution.top_k_top_p_filter([list(row)], [-1], [1.0])
    zeroed = sum(1 for g, v in zip(got[0], row) if v and not g)
    assert got == [row], (
        f"top_p=1.0 is no limit: every token is kept, but {zeroed} of 32,000 "
        "were zeroed (a float sum of the ranked probabilities reaches 1.0 "
        "before the tail: p >= 1.0 must not cut at all)"
    )
    short = _rounded_away_tail(40)
    _check(solution, [short], [-1], [1.0], "p=1.0 over a tail that sums away")
    _check(solution, [short], [20], [1.0], "k=20, p=1.0 over a tail that sums away")
    _check(solution, [short], [-1], [0.999], "p=0.999 cuts before the tail")


def test_top_k_one_is_greedy(solution):
    _check(solution, [[0.25, 0.5, 0.25]], [1], [1.0], "k=1 keeps the most likely token only")


def test_both_limits(solution):
    row = [0.0625, 0.125, 0.3125, 0.25, 0.25]
    _check(solution, [row], [2], [0.9], "k cuts before p")
    _check(solution, [row], [4], [0.5], "p cuts before k")


def test_rows_have_their_own_settings(solution):
    probs = [[0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.5, 0.25, 0.25]]
    _check(solution, probs, [1, -1, 2], [1.0, 0.6, 0.4], "three rows, three settings")


def test_not_renormalized_and_input_kept(solution):
    probs = [[0.125, 0.875]]
    got = solution.top_k_top_p_filter(probs, [1], [1.0])
    assert got == [[0.0, 0.875]], f"the kept probability stays 0.875, got {got}"
    assert probs == [[0.125, 0.875]], "the input was changed"


def test_random(solution):
    rng = random.Random(41)
    for case in range(60):
        batch, vocab = rng.randint(1, 4), rng.randint(1, 12)
        probs = []
        for _ in range(batch):
            cuts = sorted(rng.randint(0, 64) for _ in range(vocab - 1))
            counts = [b - a for a, b in zip([0] + cuts, cuts + [64])]
            probs.append([c / 64 for c in counts])
        top_k = [rng.choice([-2, -1, 0, 1, 2, 3, 5, 20]) for _ in range(batch)]
        top_p = [rng.choice([1.0, 0.9, 0.5, 0.25, 0.75, 0.1]) for _ in range(batch)]
        _check(solution, probs, top_k, top_p, f"random case {case}")
