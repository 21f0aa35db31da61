import math
import random

LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _model(head_dim, base, s):
    freqs = [base ** (-(2 * i) / head_dim) for i in range(head_dim // 2)]
    if s is None or s["rope_type"] == "default":
        return freqs
    out = []
    for f in freqs:
        w = 2 * math.pi / f
        lo = s["original_max_position_embeddings"] / s["low_freq_factor"]
        hi = s["original_max_position_embeddings"] / s["high_freq_factor"]
        if w < hi:
            out.append(f)
        elif w > lo:
            out.append(f / s["factor"])
        else:
            t = (s["original_max_position_embeddings"] / w - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"]
            )
            out.append(f * t + f / s["factor"] * (1 - t))
    return out


def _close(got, want, what):
    assert isinstance(got, list) and len(got) == len(want), (
        f"{what}: expected a list of {len(want)} values, got {got!r}"
    )
    for i, (a, b) in enumerate(zip(got, want)):
        assert math.isclose(a, b, rel_tol=1e-9), f"{what}: pair {i}: got {a}, expected {b}"


def test_default_small(solution):
    _close(solution.rope_inv_freq(4, 10000.0, None), [1.0, 0.01], "head_dim 4, base 10000")


def test_default_by_name(solution):
    got = solution.rope_inv_freq(64, 1e6, {"rope_type": "default"})
    _close(got, _model(64, 1e6, None), "rope_type 'default'")


def test_llama31_fast_pairs_kept(solution):
    got = solution.rope_inv_freq(128, 500000.0, LLAMA31)
    want = _model(128, 500000.0, LLAMA31)
    _close(got[:8], want[:8], "Llama 3.1: the fastest pairs (kept as they are)")


def test_llama31_slow_pairs_divided(solution):
    got = solution.rope_inv_freq(128, 500000.0, LLAMA31)
    want = _model(128, 500000.0, LLAMA31)
    _close(got[-10:], want[-10:], "Llama 3.1: the slowest pairs (divided by factor)")


def test_llama31_blended_pairs(solution):
    got = solution.rope_inv_freq(128, 500000.0, LLAMA31)
    want = _model(128, 500000.0, LLAMA31)
    base = _model(128, 500000.0, None)
    blended = [i for i in range(64) if base[i] / 8 < want[i] < base[i]]
    assert blended, "the test's own settings should have blended pairs"
    _close(
        [got[i] for i in blended],
        [want[i] for i in blended],
        "Llama 3.1: the pairs between (blended)",
    )
    _close(got, want, "Llama 3.1: every pair")


def test_unknown_type(solution):
    try:
        solution.rope_inv_freq(64, 10000.0, {"rope_type": "dynamic", "factor": 2.0})
    except ValueError:
        return
    raise AssertionError("rope_type 'dynamic' should raise ValueError")


def test_random_settings(solution):
    rng = random.Random(21)
    for case in range(25):
        head_dim = rng.choice([16, 32, 64, 128])
        base = rng.choice([10000.0, 500000.0, 1e6])
        low = rng.uniform(0.5, 2.0)
        s = {
            "rope_type": "llama3",
            "factor": rng.uniform(2, 32),
            "low_freq_factor": low,
            "high_freq_factor": low + rng.uniform(0.5, 6.0),
            "original_max_position_embeddings": rng.choice([2048, 4096, 8192]),
        }
        _close(
            solution.rope_inv_freq(head_dim, base, s),
            _model(head_dim, base, s),
            f"random case {case} ({s})",
        )


def test_odd_head_dim(solution):
    for head_dim in (5, 7):
        _close(
            solution.rope_inv_freq(head_dim, 10000.0, None),
            _model(head_dim, 10000.0, None),
            f"head_dim {head_dim}: head_dim // 2 pairs (the odd dimension has no partner)",
        )
        _close(
            solution.rope_inv_freq(head_dim, 10000.0, LLAMA31),
            _model(head_dim, 10000.0, LLAMA31),
            f"head_dim {head_dim}, llama3",
        )
