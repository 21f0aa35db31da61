"""Exercise 203's tests: each takes the learner's module and checks its behaviour."""

from __future__ import annotations

import random

PAGE_IDS = [[4, 3], [6, 1], [1, 7], [6, 4], [5, 4]]  # chapter 20's main: 5 tokens, top-2 of 8


def model_align(topk_ids: list[list[int]], block_m: int, num_experts: int) -> tuple:
    """Expert by expert, pair by pair, a placeholder at a time: the long way."""
    pairs = [(t * len(row) + j, e) for t, row in enumerate(topk_ids) for j, e in enumerate(row)]
    placeholder = len(pairs)
    sorted_ids, expert_ids = [], []
    for expert in range(num_experts):
        count = 0
        for pair, e in pairs:
            if e == expert:
                sorted_ids.append(pair)
                count += 1
        while count % block_m:
            sorted_ids.append(placeholder)
            count += 1
        expert_ids += [expert] * (count // block_m)
    return sorted_ids, expert_ids, len(sorted_ids)


def model_moe(x: list, w: list, weights: list, topk_ids: list) -> list:
    """Per token, per chosen expert: out[t] = sum_j weights[t][j] * (w[e] @ x[t])."""
    out = []
    for t, row in enumerate(topk_ids):
        acc = [0.0] * len(w[0])
        for j, e in enumerate(row):
            for n, w_row in enumerate(w[e]):
                dot = 0.0
                for k, value in enumerate(x[t]):
                    dot += w_row[k] * value
                acc[n] += weights[t][j] * dot
        out.append(acc)
    return out


def routing(rng: random.Random, tokens: int, top_k: int, experts: int) -> list[list[int]]:
    """Distinct experts per token, drawn from fewer than all so that some get no token."""
    used = rng.sample(range(experts), rng.randint(top_k, experts))
    return [rng.sample(used, top_k) for _ in range(tokens)]


def problem(rng: random.Random, tokens: int, top_k: int, experts: int, exact: bool = True):
    """x [T, K], w [E, N, K], weights [T, k]: small integers and eighths add up exactly."""
    hidden, out = rng.randint(1, 5), rng.randint(1, 4)
    draw = (lambda: float(rng.randint(-4, 4))) if exact else (lambda: rng.uniform(-1, 1))
    x = [[draw() for _ in range(hidden)] for _ in range(tokens)]
    w = [[[draw() for _ in range(hidden)] for _ in range(out)] for _ in range(experts)]
    weights = [[rng.randint(1, 8) / 8 for _ in range(top_k)] for _ in range(tokens)]
    return x, w, weights


def close(a: list, b: list, tol: float) -> bool:
    return len(a) == len(b) and all(
        len(ra) == len(rb) and all(abs(p - q) <= tol for p, q in zip(ra, rb))
        for ra, rb in zip(a, b)
    )


def differ(got: tuple, want: tuple) -> str:
    """Where an alignment first goes wrong: the lists can be long."""
    for name, g, w in zip(("sorted_ids", "expert_ids"), got, want):
        if g != w:
            i = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            return (
                f"{name} should be {w[i : i + 8]}... from index {i}, not {g[i : i + 8]}... "
                f"({len(w)} entries, not {len(g)})"
            )
    return f"the padded count should be {want[2]}, not {got[2]}"


def aligned(solution, topk_ids: list, block_m: int, experts: int) -> tuple:
    got = solution.moe_align_block_size([list(r) for r in topk_ids], block_m, experts)
    assert isinstance(got, tuple) and len(got) == 3, (
        "moe_align_block_size returns (sorted_ids, expert_ids, padded count)"
    )
    return list(got[0]), list(got[1]), got[2]


def test_the_pages_example(solution):
    got = aligned(solution, PAGE_IDS, 4, 8)
    want = (
        [3, 4, 10, 10, 1, 10, 10, 10, 0, 7, 9, 10, 8, 10, 10, 10, 2, 6, 10, 10, 5, 10, 10, 10],
        [1, 3, 4, 5, 6, 7],
        24,
    )
    assert got == want, (
        f"for the page's routing {PAGE_IDS} with block_m 4 and 8 experts the "
        f"result is {want}, not {got}"
    )


def test_block_of_one_has_no_placeholder(solution):
    got = aligned(solution, PAGE_IDS, 1, 8)
    want = model_align(PAGE_IDS, 1, 8)
    assert got == want, f"with block_m 1 the result is {want}, not {got}"


def test_no_tokens(solution):
    got = aligned(solution, [], 4, 8)
    assert got == ([], [], 0), f"no tokens give no pairs and no tiles: ([], [], 0), not {got}"


def test_random_routings_against_the_model(solution):
    rng = random.Random(203)
    for _ in range(300):
        top_k, experts = rng.randint(1, 8), rng.randint(8, 16)
        topk_ids = routing(rng, rng.randint(1, 40), top_k, experts)
        block_m = rng.choice([1, 2, 3, 4, 8, 16, 64])
        got = aligned(solution, topk_ids, block_m, experts)
        want = model_align(topk_ids, block_m, experts)
        assert got == want, (
            f"moe_align_block_size for {len(topk_ids)} tokens, top-{top_k}, "
            f"block_m {block_m}, {experts} experts: {differ(got, want)}"
        )


def test_no_tile_mixes_two_experts(solution):
    rng = random.Random(2031)
    for _ in range(100):
        top_k, experts, block_m = rng.randint(1, 4), rng.randint(4, 12), rng.choice([2, 4, 16])
        topk_ids = routing(rng, rng.randint(1, 30), top_k, experts)
        sorted_ids, expert_ids, padded = aligned(solution, topk_ids, block_m, experts)
        flat = [e for row in topk_ids for e in row]
        assert padded == len(sorted_ids) == len(expert_ids) * block_m, (
            f"padded count {padded}, {len(sorted_ids)} ids and {len(expert_ids)} tiles of "
            f"{block_m} do not agree"
        )
        assert sorted(p for p in sorted_ids if p != len(flat)) == list(range(len(flat))), (
            "every pair appears exactly once in sorted_ids"
        )
        for tile, expert in enumerate(expert_ids):
            rows = sorted_ids[tile * block_m : (tile + 1) * block_m]
            assert any(p != len(flat) for p in rows), f"tile {tile} holds only placeholders"
            wrong = [p for p in rows if p != len(flat) and flat[p] != expert]
            assert not wrong, f"tile {tile} is expert {expert}'s but holds pairs {wrong}"


def test_grouped_gemm_on_the_pages_routing(solution):
    rng = random.Random(20)
    x, w, weights = problem(rng, 5, 2, 8)
    sorted_ids, expert_ids, _ = model_align(PAGE_IDS, 4, 8)
    got = solution.grouped_gemm(x, w, weights, sorted_ids, expert_ids, 4, 2)
    want = model_moe(x, w, weights, PAGE_IDS)
    assert close(got, want, 0.0), f"grouped_gemm on the page's routing gives {got}, not {want}"


def test_grouped_gemm_random_against_the_model(solution):
    rng = random.Random(2032)
    for case in range(150):
        tokens, top_k, experts = rng.randint(1, 12), rng.randint(1, 8), rng.randint(8, 10)
        block_m = rng.choice([1, 2, 4, 8, 64])
        topk_ids = routing(rng, tokens, top_k, experts)
        x, w, weights = problem(rng, tokens, top_k, experts, exact=case % 2 == 0)
        sorted_ids, expert_ids, _ = model_align(topk_ids, block_m, experts)
        got = solution.grouped_gemm(x, w, weights, sorted_ids, expert_ids, block_m, top_k)
        want = model_moe(x, w, weights, topk_ids)
        assert close(got, want, 1e-9), (
            f"grouped_gemm for routing {topk_ids}, block_m {block_m}: {got}, not {want}"
        )


def test_grouped_gemm_walks_the_tiles_it_is_given(solution):
    # Tiles in another order, and a tile of placeholders only: the sum must not change.
    rng = random.Random(2033)
    topk_ids = [[0, 2], [2, 1], [1, 0], [2, 0]]
    x, w, weights = problem(rng, 4, 2, 3)
    sorted_ids, expert_ids, _ = model_align(topk_ids, 2, 3)
    tiles = [(sorted_ids[i * 2 : i * 2 + 2], e) for i, e in enumerate(expert_ids)]
    tiles = tiles[::-1] + [([8, 8], 1)]
    shuffled = [p for rows, _ in tiles for p in rows]
    got = solution.grouped_gemm(x, w, weights, shuffled, [e for _, e in tiles], 2, 2)
    want = model_moe(x, w, weights, topk_ids)
    assert close(got, want, 0.0), (
        f"with the tiles reversed and a tile of placeholders the output is {got}, not {want}"
    )


def test_grouped_gemm_takes_each_tiles_expert(solution):
    # The expert comes from expert_ids, not from anywhere else: relabel one tile's expert.
    rng = random.Random(2034)
    x, w, weights = problem(rng, 2, 1, 3)
    got = solution.grouped_gemm(x, w, weights, [0, 1], [2, 1], 1, 1)
    want = model_moe(x, w, weights, [[2], [1]])
    assert close(got, want, 0.0), (
        f"tile 0 is expert 2's, so token 0 goes through w[2]: {want}, not {got}"
    )


def test_inputs_are_left_as_they_were(solution):
    rng = random.Random(2035)
    topk_ids = [[1, 0], [0, 2]]
    x, w, weights = problem(rng, 2, 2, 3)
    copies = [[list(r) for r in x], [[list(r) for r in m] for m in w], [list(r) for r in weights]]
    sorted_ids, expert_ids, _ = solution.moe_align_block_size(topk_ids, 4, 3)
    ids_copy = (list(sorted_ids), list(expert_ids))
    solution.grouped_gemm(x, w, weights, sorted_ids, expert_ids, 4, 2)
    assert topk_ids == [[1, 0], [0, 2]], "moe_align_block_size changed topk_ids"
    assert [x, w, weights] == copies, "grouped_gemm changed x, w or weights"
    assert (list(sorted_ids), list(expert_ids)) == ids_copy, "grouped_gemm changed its ids"
