import math
import random


def _model(values, q):
    s = sorted(values)
    pos = q / 100 * (len(s) - 1)
    i = math.floor(pos)
    if i == len(s) - 1:
        return s[i]
    return s[i] * (1 - (pos - i)) + s[i + 1] * (pos - i)


def _check(solution, values, q, want, what):
    got = solution.percentile(list(values), q)
    assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12), (
        f"{what}: percentile({values}, {q}) gave {got}, expected {want}"
    )


def test_examples(solution):
    _check(solution, [1, 2, 3, 4], 50, 2.5, "p50")
    _check(solution, [1, 2, 3, 4], 90, 3.7, "p90")
    _check(solution, [5], 99, 5, "one value")


def test_ends(solution):
    _check(solution, [3.0, 1.0, 2.0], 0, 1.0, "p0 is the minimum")
    _check(solution, [3.0, 1.0, 2.0], 100, 3.0, "p100 is the maximum")


def test_unsorted_input_kept(solution):
    values = [0.95, 0.08, 0.30, 0.11]
    got = solution.percentile(values, 50)  # the list itself, not a copy
    assert math.isclose(got, 0.205, rel_tol=1e-12), f"percentile({values}, 50) gave {got}"
    assert values == [0.95, 0.08, 0.30, 0.11], f"percentile changed its input list: {values}"


def test_ttft_example(solution):
    ttfts = [0.12, 0.08, 0.30, 0.11, 0.09, 0.10, 0.95, 0.13, 0.10, 0.12]
    for q in (50, 90, 99):
        _check(solution, ttfts, q, _model(ttfts, q), f"the chapter's ten TTFTs, p{q}")


def test_repeated_values(solution):
    _check(solution, [2, 2, 2, 7], 50, 2, "repeated values")


def test_empty(solution):
    try:
        solution.percentile([], 50)
    except ValueError:
        return
    raise AssertionError("percentile([], 50) should raise ValueError")


def test_random(solution):
    rng = random.Random(151)
    for case in range(200):
        values = [rng.uniform(0, 10) for _ in range(rng.randint(1, 30))]
        q = rng.choice([0, 1, 25, 50, 90, 99, 99.9, 100, rng.uniform(0, 100)])
        _check(solution, values, q, _model(values, q), f"random case {case}")
