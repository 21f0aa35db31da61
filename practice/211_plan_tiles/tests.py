"""Exercise 211's tests: each takes the learner's module and checks its behaviour."""

from __future__ import annotations

import random


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tiles_needed(counts: list[int], block_m: int) -> int:
    """Tiles an alignment uses for these per-expert pair counts."""
    return sum(cdiv(count, block_m) for count in counts)


def compositions(total: int, parts: int):
    """Every way to give `total` pairs to `parts` experts (a top-1 routing can do any of them)."""
    if parts == 1:
        yield [total]
        return
    for first in range(total + 1):
        for rest in compositions(total - first, parts - 1):
            yield [first] + rest


def model_align(
    topk_ids: list[list[int]], num_experts: int, block_m: int, capacity: int
) -> tuple[list[int], list[int], int]:
    """A stable sort of the pairs by expert, each run padded with the sentinel, then the tail."""
    flat = [e for row in topk_ids for e in row]
    sentinel = len(flat)
    order = sorted(range(len(flat)), key=lambda pair: flat[pair])  # stable: pair order kept
    sorted_ids, expert_ids = [], []
    for expert in range(num_experts):
        run = [pair for pair in order if flat[pair] == expert]
        while len(run) % block_m:
            run.append(sentinel)
        sorted_ids += run
        expert_ids += [expert] * (len(run) // block_m)
    num_padded = len(sorted_ids)
    sorted_ids += [sentinel] * (capacity * block_m - num_padded)
    expert_ids += [-1] * (capacity - len(expert_ids))
    return sorted_ids, expert_ids, num_padded


def model_offsets(block_counts: list[list[int]], block_m: int) -> list[list[int]]:
    """Slot of block b's first pair of expert e: the whole tiles of the experts before e, then
    the pairs of e in blocks before b."""
    experts = range(len(block_counts[0]))
    totals = [sum(block[e] for block in block_counts) for e in experts]
    offsets = []
    for b in range(len(block_counts)):
        row = []
        for e in experts:
            before = sum(cdiv(totals[x], block_m) for x in range(e)) * block_m
            row.append(before + sum(block_counts[c][e] for c in range(b)))
        offsets.append(row)
    return offsets


def routing(rng: random.Random, tokens: int, top_k: int, experts: int) -> list[list[int]]:
    """Distinct experts per token, drawn from fewer than all so that some get no pair."""
    used = rng.sample(range(experts), rng.randint(top_k, experts))
    return [rng.sample(used, top_k) for _ in range(tokens)]


def capacity_of(solution, num_pairs: int, num_experts: int, block_m: int) -> int:
    capacity = solution.max_tiles(num_pairs, num_experts, block_m)
    assert isinstance(capacity, int), f"max_tiles returns an int, not {capacity!r}"
    return capacity


def aligned(solution, topk_ids: list, num_experts: int, block_m: int, block_t: int) -> tuple:
    got = solution.align([list(row) for row in topk_ids], num_experts, block_m, block_t)
    assert isinstance(got, tuple) and len(got) == 3, (
        "align returns (sorted_ids, expert_ids, num_padded)"
    )
    return list(got[0]), list(got[1]), got[2]


def differ(got: tuple, want: tuple) -> str:
    """Where an alignment first goes wrong: the lists can be long."""
    for name, g, w in zip(("sorted_ids", "expert_ids"), got, want):
        if g != w:
            i = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            return (
                f"{name} should be {w[i : i + 8]}... from index {i}, not {g[i : i + 8]}... "
                f"({len(w)} entries, not {len(g)})"
            )
    return f"num_padded should be {want[2]}, not {got[2]}"


def check_align(
    solution, topk_ids: list, num_experts: int, block_m: int, block_t: int, what: str
) -> tuple:
    num_pairs = sum(len(row) for row in topk_ids)
    capacity = capacity_of(solution, num_pairs, num_experts, block_m)
    got = aligned(solution, topk_ids, num_experts, block_m, block_t)
    want = model_align(topk_ids, num_experts, block_m, capacity)
    assert got == want, (
        f"{what}: align({topk_ids if len(topk_ids) <= 6 else '...'}, "
        f"{num_experts}, block_m={block_m}, block_t={block_t}): "
        f"{differ(got, want)}"
    )
    return got


def test_max_tiles_is_the_worst_case(solution):
    for block_m in (1, 2, 3, 4):
        for experts in range(1, 6):
            for pairs in range(1, 13):
                worst = max(
                    compositions(pairs, experts), key=lambda counts: tiles_needed(counts, block_m)
                )
                need = tiles_needed(worst, block_m)
                got = capacity_of(solution, pairs, experts, block_m)
                assert got >= need, (
                    f"max_tiles({pairs}, {experts}, {block_m}) is {got}, but "
                    f"pair counts {worst} per expert need {need} tiles"
                )
                assert got == need, (
                    f"max_tiles({pairs}, {experts}, {block_m}) is {got}: more "
                    f"than the {need} tiles the worst routing {worst} needs"
                )


def test_max_tiles_at_a_real_shape(solution):
    # Qwen3-30B-A3B: 128 experts, top-8; a few experts with one pair each and the rest on one
    for tokens, block_m in ((1, 16), (5, 16), (64, 16), (512, 64), (8192, 128)):
        pairs, experts = tokens * 8, 128
        lonely = min(experts, pairs) - 1  # experts with one pair; the rest go to expert 0
        need = lonely + cdiv(pairs - lonely, block_m)
        got = capacity_of(solution, pairs, experts, block_m)
        assert got == need, (
            f"max_tiles({pairs}, {experts}, {block_m}) is {got}: the worst "
            f"routing needs {need} tiles"
        )


def test_the_statements_example(solution):
    capacity = capacity_of(solution, 6, 4, 2)
    got = aligned(solution, [[2, 0], [0, 1], [2, 0]], 4, 2, 2)
    want = (
        [1, 2, 5, 6, 3, 6, 0, 4] + [6] * (capacity - 4) * 2,
        [0, 0, 1, 2] + [-1] * (capacity - 4),
        8,
    )
    assert got == want, f"align([[2, 0], [0, 1], [2, 0]], 4, 2, 2) is {want}, not {got}"
    got = solution.plan_tiles([[2, 1, 1, 0], [1, 0, 1, 0]], 2)
    want = ([[0, 4, 6, 8], [2, 5, 7, 8]], [0, 0, 1, 2] + [-1] * (capacity - 4), 8)
    assert isinstance(got, tuple) and len(got) == 3, (
        "plan_tiles returns (block_offsets, expert_ids, num_padded)"
    )
    assert (list(map(list, got[0])), list(got[1]), got[2]) == want, (
        f"plan_tiles([[2, 1, 1, 0], [1, 0, 1, 0]], 2) is {want}, not {got}"
    )


def test_plan_tiles_small_example(solution):
    # experts 0, 1, 2 get 3, 0 and 4 pairs: tiles 0-1 are expert 0's, 2-3 expert 2's
    block_counts = [[2, 0, 1], [1, 0, 3]]
    capacity = capacity_of(solution, 7, 3, 2)
    got = solution.plan_tiles([list(row) for row in block_counts], 2)
    want = ([[0, 4, 4], [2, 4, 5]], [0, 0, 2, 2] + [-1] * (capacity - 4), 8)
    assert isinstance(got, tuple) and len(got) == 3, (
        "plan_tiles returns (block_offsets, expert_ids, num_padded)"
    )
    assert (list(map(list, got[0])), list(got[1]), got[2]) == want, (
        f"plan_tiles({block_counts}, 2) is {want}, not {got}"
    )


def test_plan_tiles_random_against_the_model(solution):
    rng = random.Random(211)
    for _ in range(200):
        experts, block_m = rng.randint(1, 9), rng.choice([1, 2, 3, 4, 8, 16])
        blocks = rng.randint(1, 6)
        block_counts = [
            [rng.choice([0, 0, 1, 2, 5, 16]) for _ in range(experts)] for _ in range(blocks)
        ]
        if not any(map(any, block_counts)):
            block_counts[0][0] = 1
        num_pairs = sum(map(sum, block_counts))
        capacity = capacity_of(solution, num_pairs, experts, block_m)
        counts = [sum(block[e] for block in block_counts) for e in range(experts)]
        used = [e for e in range(experts) for _ in range(cdiv(counts[e], block_m))]
        want = (
            model_offsets(block_counts, block_m),
            used + [-1] * (capacity - len(used)),
            len(used) * block_m,
        )
        got = solution.plan_tiles([list(row) for row in block_counts], block_m)
        got = (list(map(list, got[0])), list(got[1]), got[2])
        for name, g, w in zip(("block_offsets", "expert_ids", "num_padded"), got, want):
            assert g == w, f"plan_tiles({block_counts}, {block_m}): {name} should be {w}, not {g}"


def test_align_random_against_the_model(solution):
    rng = random.Random(2110)
    for _ in range(200):
        top_k, experts = rng.randint(1, 8), rng.randint(8, 16)
        topk_ids = routing(rng, rng.randint(1, 40), top_k, experts)
        block_m, block_t = rng.choice([1, 2, 3, 4, 8, 16, 64]), rng.choice([1, 2, 3, 4, 16])
        check_align(solution, topk_ids, experts, block_m, block_t, "a random routing")


def test_one_token(solution):
    check_align(solution, [[3, 0, 5]], 8, 4, 16, "one token")
    check_align(solution, [[2]], 4, 16, 1, "one token, top-1")


def test_tokens_not_a_multiple_of_the_block(solution):
    topk_ids = [[e % 5, (e + 2) % 5] for e in range(7)]  # 7 tokens in blocks of 3: 3, 3, 1
    check_align(solution, topk_ids, 5, 2, 3, "7 tokens in blocks of 3")
    check_align(solution, topk_ids, 5, 4, 16, "7 tokens in one block of 16")


def test_all_pairs_to_one_expert(solution):
    topk_ids = [[6] for _ in range(37)]
    sorted_ids, expert_ids, num_padded = check_align(
        solution, topk_ids, 8, 16, 4, "37 tokens all to expert 6"
    )
    assert expert_ids[:3] == [6, 6, 6] and num_padded == 48, (
        "37 pairs of expert 6 fill three tiles of 16: 48 slots, 11 of them padding"
    )


def test_every_expert_one_pair_reaches_max_tiles(solution):
    # as many experts as pairs, one each: every pair is a tile of its own, the worst case
    rng = random.Random(2111)
    for tokens, top_k, block_m in ((1, 8, 16), (4, 2, 4), (8, 4, 64), (3, 1, 2)):
        experts = tokens * top_k
        shuffled = rng.sample(range(experts), experts)
        topk_ids = [shuffled[t * top_k : (t + 1) * top_k] for t in range(tokens)]
        _, expert_ids, num_padded = check_align(
            solution, topk_ids, experts, block_m, 2, "every expert one pair"
        )
        assert -1 not in expert_ids and num_padded == experts * block_m, (
            f"{experts} pairs on {experts} experts use all {experts} tiles, as max_tiles says"
        )


def test_block_of_one_has_no_padding(solution):
    topk_ids = [[4, 3], [6, 1], [1, 7], [6, 4], [5, 4]]
    sorted_ids, expert_ids, num_padded = check_align(solution, topk_ids, 8, 1, 2, "block_m 1")
    assert num_padded == 10 and sorted(sorted_ids[:10]) == list(range(10)), (
        "with block_m 1 the first 10 slots hold the 10 pairs and nothing else"
    )


def test_sizes_are_fixed_whatever_the_routing(solution):
    # a CUDA graph replays the same buffers: their sizes depend on T, k, E and block_m only
    rng = random.Random(2112)
    tokens, top_k, experts, block_m = 12, 2, 8, 4
    capacity = capacity_of(solution, tokens * top_k, experts, block_m)
    for used in (2, 3, 5, 8):
        for _ in range(10):
            topk_ids = [rng.sample(range(used), top_k) for _ in range(tokens)]
            sorted_ids, expert_ids, num_padded = aligned(solution, topk_ids, experts, block_m, 5)
            assert (len(sorted_ids), len(expert_ids)) == (capacity * block_m, capacity), (
                f"with {used} experts in use: {len(sorted_ids)} slots and {len(expert_ids)} "
                f"tiles, not {capacity * block_m} and {capacity} (max_tiles, whatever the routing)"
            )
            assert num_padded <= len(sorted_ids), "num_padded is more than the buffer holds"


def test_tail_and_padding_hold_markers(solution):
    rng = random.Random(2113)
    for _ in range(60):
        topk_ids = routing(rng, rng.randint(1, 20), rng.randint(1, 4), 10)
        block_m = rng.choice([2, 4, 8])
        sorted_ids, expert_ids, num_padded = aligned(solution, topk_ids, 10, block_m, 4)
        flat = [e for row in topk_ids for e in row]
        used = num_padded // block_m
        assert set(expert_ids[used:]) <= {-1}, (
            f"expert_ids past the {used} used tiles are all -1, not {expert_ids[used:]}"
        )
        assert set(sorted_ids[num_padded:]) <= {len(flat)}, (
            f"slots past num_padded {num_padded} hold the sentinel {len(flat)}"
        )
        assert sorted(p for p in sorted_ids if p != len(flat)) == list(range(len(flat))), (
            "every pair appears exactly once in sorted_ids"
        )
        for tile in range(used):
            rows = sorted_ids[tile * block_m : (tile + 1) * block_m]
            wrong = [p for p in rows if p != len(flat) and flat[p] != expert_ids[tile]]
            assert not wrong, f"tile {tile} is expert {expert_ids[tile]}'s but holds {wrong}"
            assert rows[0] != len(flat), f"tile {tile} begins with padding"


def test_inputs_are_left_as_they_were(solution):
    topk_ids = [[1, 0], [0, 2], [2, 1]]
    solution.align(topk_ids, 3, 2, 2)
    block_counts = [[1, 1, 0], [1, 1, 2]]
    solution.plan_tiles(block_counts, 2)
    assert topk_ids == [[1, 0], [0, 2], [2, 1]], "align changed topk_ids"
    assert block_counts == [[1, 1, 0], [1, 1, 2]], "plan_tiles changed block_counts"
