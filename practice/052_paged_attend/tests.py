import math
import random


def _model(q, k, v, cached):
    out = []
    for i in range(len(q)):
        row = []
        for h in range(len(q[i])):
            g = h * len(k[0]) // len(q[i])
            d = len(q[i][h])
            s = [
                sum(q[i][h][x] * k[j][g][x] for x in range(d)) * d**-0.5
                for j in range(cached + i + 1)
            ]
            m = max(s)
            e = [math.exp(x - m) for x in s]
            row.append([sum(e[j] * v[j][g][x] for j in range(len(e))) / sum(e) for x in range(d)])
        out.append(row)
    return out


def _check(solution, q, k, v, cached, what):
    got = solution.attend(q, k, v, cached)
    want = _model(q, k, v, cached)
    assert len(got) == len(want), f"{what}: {len(got)} tokens out, expected {len(want)}"
    for i, (gt, wt) in enumerate(zip(got, want)):
        assert len(gt) == len(wt), f"{what}: token {i} has {len(gt)} heads, expected {len(wt)}"
        for h, (gh, wh) in enumerate(zip(gt, wt)):
            assert len(gh) == len(wh) and all(
                math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(gh, wh)
            ), f"{what}: token {i}, head {h}: got {gh}, expected {wh}"


def _rand(rng, *shape):
    if len(shape) == 1:
        return [rng.gauss(0, 1) for _ in range(shape[0])]
    return [_rand(rng, *shape[1:]) for _ in range(shape[0])]


def test_readme_example(solution):
    _check(
        solution,
        [[[1.0, 0.0]]],
        [[[1.0, 0.0]], [[0.0, 1.0]]],
        [[[1.0, 2.0]], [[3.0, 4.0]]],
        1,
        "README example",
    )


def test_prefill_is_causal(solution):
    rng = random.Random(5)
    k, v = _rand(rng, 3, 1, 2), _rand(rng, 3, 1, 2)
    got = solution.attend(_rand(rng, 3, 1, 2), k, v, 0)
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(got[0][0], v[0][0])), (
        f"the first token of a prefill sees only itself: expected {v[0][0]}, got {got[0][0]}"
    )
    _check(solution, _rand(rng, 3, 1, 2), k, v, 0, "a prefill of 3 tokens")


def test_head_groups(solution):
    rng = random.Random(6)
    _check(
        solution,
        _rand(rng, 2, 4, 3),
        _rand(rng, 5, 2, 3),
        _rand(rng, 5, 2, 3),
        3,
        "4 query heads over 2 KV heads",
    )
    _check(
        solution,
        _rand(rng, 1, 6, 2),
        _rand(rng, 4, 1, 2),
        _rand(rng, 4, 1, 2),
        3,
        "6 query heads over 1 KV head",
    )


def test_random(solution):
    rng = random.Random(52)
    for case in range(30):
        hkv = rng.choice([1, 2])
        hq, d = hkv * rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8])
        e, cached = rng.randint(1, 5), rng.randint(0, 8)
        _check(
            solution,
            _rand(rng, e, hq, d),
            _rand(rng, cached + e, hkv, d),
            _rand(rng, cached + e, hkv, d),
            cached,
            f"random case {case}",
        )
