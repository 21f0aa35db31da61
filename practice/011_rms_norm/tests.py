import math
import random


def _model(x, weight, eps):
    rows = []
    for row in x:
        ms = 0.0
        for v in row:
            ms += v * v
        ms /= len(row)
        rows.append([row[i] / math.sqrt(ms + eps) * weight[i] for i in range(len(row))])
    return rows


def _close(got, want, what):
    assert isinstance(got, list) and len(got) == len(want), (
        f"{what}: expected {len(want)} rows, got {got!r}"
    )
    for r, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w), f"{what}: row {r} has {len(g)} entries, expected {len(w)}"
        for i, (a, b) in enumerate(zip(g, w)):
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (
                f"{what}: row {r}, entry {i}: got {a}, expected {b}"
            )


def test_example(solution):
    _close(
        solution.rms_norm([[3.0, 4.0]], [1.0, 2.0], 0.0),
        [[3 / 12.5**0.5, 8 / 12.5**0.5]],
        "rms_norm([[3, 4]], [1, 2], 0)",
    )


def test_weight_per_column(solution):
    x = [[1.0, -2.0, 3.0, 0.5], [0.0, 1.0, 0.0, -1.0]]
    w = [0.5, 1.0, -2.0, 4.0]
    _close(solution.rms_norm(x, w, 1e-6), _model(x, w, 1e-6), "two rows, uneven weights")


def test_eps_inside_the_square_root(solution):
    x, w = [[1e-3, -1e-3]], [1.0, 1.0]
    _close(
        solution.rms_norm(x, w, 1e-6),
        _model(x, w, 1e-6),
        "tiny row where eps is as large as the mean square",
    )


def test_zero_row(solution):
    got = solution.rms_norm([[0.0, 0.0, 0.0]], [1.0, 2.0, 3.0], 1e-5)
    _close(got, [[0.0, 0.0, 0.0]], "a row of zeros (eps keeps it finite)")


def test_mean_not_sum(solution):
    x, w = [[2.0] * 8], [1.0] * 8
    _close(solution.rms_norm(x, w, 0.0), [[1.0] * 8], "a constant row normalizes to ones")


def test_empty_batch(solution):
    assert solution.rms_norm([], [1.0, 2.0], 1e-6) == [], "no rows in, no rows out"


def test_inputs_unchanged(solution):
    x, w = [[1.0, 2.0], [3.0, -4.0]], [0.5, 0.25]
    solution.rms_norm(x, w, 1e-6)
    assert x == [[1.0, 2.0], [3.0, -4.0]] and w == [0.5, 0.25], "rms_norm changed its inputs"


def test_random(solution):
    rng = random.Random(11)
    for case in range(30):
        n, d = rng.randint(1, 5), rng.randint(1, 16)
        x = [[rng.uniform(-10, 10) for _ in range(d)] for _ in range(n)]
        w = [rng.uniform(-2, 2) for _ in range(d)]
        eps = rng.choice([0.0, 1e-6, 1e-2, 1.0])
        _close(solution.rms_norm(x, w, eps), _model(x, w, eps), f"random case {case}")
