import math
import random


def _ranges(seq_len, splits, block):
    per = -(-seq_len // splits)
    per = -(-per // block) * block
    out = []
    for s in range(splits):
        if s * per < seq_len:
            out.append((s * per, min(seq_len, (s + 1) * per)))
    return out


def _attend(q, keys, values):
    scores = [sum(a * b for a, b in zip(q, k)) for k in keys]
    top = max(scores)
    w = [math.exp(s - top) for s in scores]
    z = sum(w)
    out = [sum(wi * v[d] for wi, v in zip(w, values)) / z for d in range(len(values[0]))]
    return out, top + math.log(z)


def test_ranges_examples(solution):
    for args, want in [
        ((100, 4, 16), [(0, 32), (32, 64), (64, 96), (96, 100)]),
        ((10, 4, 16), [(0, 10)]),
        ((64, 2, 32), [(0, 32), (32, 64)]),
    ]:
        got = [tuple(r) for r in solution.split_ranges(*args)]
        assert got == want, f"split_ranges{args}: got {got}, expected {want}"


def test_ranges_random(solution):
    rng = random.Random(16)
    for _ in range(300):
        args = (rng.randint(1, 3000), rng.choice([1, 2, 3, 4, 8, 16, 32]), rng.choice([1, 16, 64]))
        got = [tuple(r) for r in solution.split_ranges(*args)]
        assert got == _ranges(*args), f"split_ranges{args}: got {got}, expected {_ranges(*args)}"


def _check_merge(solution, q, keys, values, splits, block, what):
    parts = [_attend(q, keys[a:b], values[a:b]) for a, b in _ranges(len(keys), splits, block)]
    got = solution.combine_splits([(list(o), lse) for o, lse in parts])
    want, _ = _attend(q, keys, values)
    assert len(got) == len(want) and all(
        math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-12) for g, w in zip(got, want)
    ), f"{what}: merged output {got}, attention over all keys {want}"


def test_one_split(solution):
    out = solution.combine_splits([([0.5, -2.0], 3.0)])
    assert all(math.isclose(a, b) for a, b in zip(out, [0.5, -2.0])), (
        f"one split is its own output, got {out}"
    )


def test_two_equal_splits(solution):
    out = solution.combine_splits([([1.0, 0.0], 0.0), ([0.0, 1.0], 0.0)])
    assert all(math.isclose(a, b) for a, b in zip(out, [0.5, 0.5])), (
        f"two splits with equal lse average, got {out}"
    )


def test_random_attention(solution):
    rng = random.Random(161)
    for case in range(30):
        d, n = rng.randint(1, 8), rng.randint(1, 200)
        q = [rng.gauss(0, 1) for _ in range(d)]
        keys = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(n)]
        values = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(n)]
        _check_merge(
            solution,
            q,
            keys,
            values,
            rng.choice([2, 3, 4, 8]),
            rng.choice([1, 8, 16]),
            f"random case {case}",
        )


def test_large_scores(solution):
    rng = random.Random(1000)
    for sign in (1, -1):
        q = [sign * 100.0, 0.0]
        keys = [[10.0 + rng.uniform(-0.05, 0.05), rng.gauss(0, 1)] for _ in range(40)]
        values = [[rng.gauss(0, 1), rng.gauss(0, 1)] for _ in range(40)]
        _check_merge(solution, q, keys, values, 4, 8, f"scores around {sign * 1000}")


def test_splits_far_apart(solution):
    # one split's lse is far above the others (first, last or between): subtracting any
    # lse but the largest overflows or loses the answer
    big, small = [1.0, -2.0], [5.0, 7.0]
    for lses in ([-1000.0, 1000.0], [1000.0, -1000.0], [0.0, 800.0, -800.0]):
        parts = [(list(big if lse == max(lses) else small), lse) for lse in lses]
        got = solution.combine_splits(parts)
        assert all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(got, big)), (
            f"splits with lse {lses}: the largest one's output {big} is all that counts, got {got}"
        )
    parts = [([1.0, 0.0], -1000.0), ([0.0, 1.0], -1000.0 + math.log(3.0))]
    got = solution.combine_splits(parts)
    assert all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(got, [0.25, 0.75])), (
        f"two splits with lse -1000 and -1000 + log 3 weigh 1 : 3, got {got}"
    )
    rng = random.Random(1616)
    q = [1.0]
    keys = [[rng.uniform(999.0, 1001.0)] for _ in range(8)] + [
        [rng.uniform(-1001.0, -999.0)] for _ in range(24)
    ]
    values = [[rng.gauss(0, 1)] for _ in range(32)]
    _check_merge(solution, q, keys[::-1], values, 4, 8, "scores near -1000 first, 1000 last")
