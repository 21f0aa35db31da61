import math
import random


def _model(x, pos, freqs):
    h = len(freqs)
    out = list(x)
    for i in range(h):
        t = pos * freqs[i]
        out[i] = x[i] * math.cos(t) - x[h + i] * math.sin(t)
        out[h + i] = x[i] * math.sin(t) + x[h + i] * math.cos(t)
    return out


def _close(got, want, what):
    assert isinstance(got, list) and len(got) == len(want), (
        f"{what}: expected {len(want)} values, got {got!r}"
    )
    for i, (a, b) in enumerate(zip(got, want)):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (
            f"{what}: dim {i}: got {a}, expected {b}"
        )


def test_quarter_turn(solution):
    _close(
        solution.apply_rotary([1.0, 0.0], 1, [math.pi / 2]),
        [0.0, 1.0],
        "apply_rotary([1, 0], 1, [pi/2])",
    )


def test_pairs_are_i_and_i_plus_half(solution):
    x = [1.0, 2.0, 3.0, 4.0]
    freqs = [0.5, 0.25]
    _close(
        solution.apply_rotary(x, 3, freqs),
        _model(x, 3, freqs),
        "D = 4: dim 0 pairs with dim 2, dim 1 with dim 3",
    )


def test_position_zero(solution):
    x = [0.3, -1.2, 2.5, 0.7, 1.1, -0.4]
    _close(solution.apply_rotary(x, 0, [1.0, 0.1, 0.01]), x, "position 0 leaves x as it is")


def test_input_unchanged(solution):
    x = [1.0, 2.0, 3.0, 4.0]
    solution.apply_rotary(x, 5, [0.5, 0.25])
    assert x == [1.0, 2.0, 3.0, 4.0], "apply_rotary changed its input"


def test_relative_positions(solution):
    rng = random.Random(22)
    d = 16
    freqs = [10000.0 ** (-2 * i / d) for i in range(d // 2)]
    q = [rng.uniform(-1, 1) for _ in range(d)]
    k = [rng.uniform(-1, 1) for _ in range(d)]

    def dot(a, b):
        return sum(u * v for u, v in zip(a, b))

    base = dot(solution.apply_rotary(q, 7, freqs), solution.apply_rotary(k, 3, freqs))
    for shift in (1, 10, 100):
        moved = dot(
            solution.apply_rotary(q, 7 + shift, freqs), solution.apply_rotary(k, 3 + shift, freqs)
        )
        assert math.isclose(base, moved, rel_tol=1e-9, abs_tol=1e-9), (
            f"q.k at positions (7, 3) is {base} but at (7+{shift}, 3+{shift}) is {moved}: "
            "it should depend on the distance only"
        )


def test_random(solution):
    rng = random.Random(2)
    for case in range(40):
        half = rng.randint(1, 16)
        x = [rng.uniform(-3, 3) for _ in range(2 * half)]
        freqs = [rng.uniform(0, 1.5) for _ in range(half)]
        pos = rng.randint(0, 4096)
        _close(solution.apply_rotary(x, pos, freqs), _model(x, pos, freqs), f"random case {case}")
